//! `--device cpu|cuda[:N]`: which [`ComputeBackend`] runs the products of `run`, `chat`,
//! `bench`, `perplexity` and `logits`.

use std::fmt;
use std::str::FromStr;

use anyhow::Result;
use infer_compute::{ComputeBackend, CpuBackend, KvType};

/// The error of `--device cuda` in a binary built without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub const NO_CUDA: &str =
    "this infer was built without CUDA: cargo build --release --features cuda";

/// A compute device: the CPU, or CUDA GPU `N` (`cuda` = `cuda:0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda(usize),
}

impl FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` or `cuda:N` (N a GPU ordinal), case-insensitive.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let l = s.to_ascii_lowercase();
        match l.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match l.strip_prefix("cuda:") {
                Some(n) => n.parse().map(Device::Cuda).map_err(|_| {
                    format!("'{s}': the GPU ordinal after 'cuda:' must be a number (cuda:0)")
                }),
                None => Err(format!("'{s}': expected cpu, cuda or cuda:N")),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// The `--device` option (flattened into each inference command's arguments).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DeviceArgs {
    /// Compute device: cpu, cuda (the first GPU) or cuda:N. CUDA needs a binary built with
    /// `--features cuda`, an NVIDIA driver and NVRTC (libnvrtc.so) on the loader path. On CUDA
    /// the forward pass runs on the GPU (weights, KV cache and activations resident; the MoE
    /// and walk FFNs on the host), and a decode step of a shape seen before is one CUDA graph
    /// replay.
    #[arg(long, default_value = "cpu", value_parser = Device::from_str)]
    pub device: Device,
    /// How the KV cache stores keys and values: f32, f16 or q8_0 (ggml's 8-bit blocks: 17/32 of
    /// f16's memory; needs head_dim a multiple of 32; cuda only), as llama.cpp's `-ctk/-ctv`.
    /// Default: f16 on cuda (llama.cpp's default), f32 on cpu (which stores f32 or f16).
    #[arg(long, value_parser = KvType::from_str)]
    pub kv_type: Option<KvType>,
}

impl DeviceArgs {
    /// With `explain`, say on stderr where the prompt's and the decoded tokens' operations run.
    pub fn explain(&self, explain: bool) {
        if explain {
            eprintln!("{}", prompt_mode(self));
            eprintln!("decode: {}", decode_mode(self));
        }
    }

    /// [`crate::kv_memory::check`] of `w` for `model` on `backend` (this device): prints the
    /// `memory:` line with `explain`; errors when it does not fit, naming `what` and `fix`.
    pub fn check_memory(
        &self,
        model: &infer_inference::Model<'_>,
        backend: &dyn ComputeBackend,
        w: &crate::kv_memory::Workload,
        what: &str,
        fix: &str,
        explain: bool,
    ) -> Result<(crate::kv_memory::Need, crate::kv_memory::Room)> {
        let device = self.device.to_string();
        crate::kv_memory::check(model, backend, &device, w, what, fix, explain)
    }

    /// The backend of the chosen device. Errors: `cuda` in a build without the `cuda`
    /// feature ([`NO_CUDA`]), or a CUDA device that cannot be opened (no driver, no NVRTC, no
    /// such GPU; the message says which).
    pub fn backend(&self) -> Result<Box<dyn ComputeBackend>> {
        self.check()?;
        match self.device {
            Device::Cpu => Ok(Box::new(CpuBackend::new().with_kv_type(self.kv_type()))),
            Device::Cuda(n) => cuda_backend(n, self.kv_type()),
        }
    }

    /// The KV cache type of the chosen device: `--kv-type`, else f16 on cuda and f32 on the CPU.
    pub fn kv_type(&self) -> KvType {
        self.kv_type.unwrap_or(match self.device {
            Device::Cpu => KvType::F32,
            Device::Cuda(_) => KvType::F16,
        })
    }

    /// The flags' own errors, before anything is loaded (`serve` checks them before it
    /// listens): `cuda` in a build without the `cuda` feature ([`NO_CUDA`]), a `--kv-type` the
    /// CPU backend cannot store.
    pub fn check(&self) -> Result<()> {
        #[cfg(not(feature = "cuda"))]
        if self.device != Device::Cpu {
            anyhow::bail!(NO_CUDA);
        }
        match (self.device, self.kv_type) {
            (Device::Cpu, Some(kv @ KvType::Q8_0)) => anyhow::bail!(
                "--kv-type {kv}: the CPU backend stores its KV cache as f32 or f16 only (q8_0 \
                 caches are for --device cuda, in a build with --features cuda)"
            ),
            _ => Ok(()),
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_backend(ordinal: usize, kv: KvType) -> Result<Box<dyn ComputeBackend>> {
    use anyhow::Context;
    let b = infer_compute::cuda::CudaBackend::new(ordinal)
        .with_context(|| format!("opening CUDA device {ordinal}"))?;
    Ok(Box::new(b.with_kv_type(kv)))
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend(_ordinal: usize, _kv: KvType) -> Result<Box<dyn ComputeBackend>> {
    anyhow::bail!(NO_CUDA)
}

/// `prompt: …` line of `--explain`: where the forward pass's operations run.
pub fn prompt_mode(args: &DeviceArgs) -> String {
    match args.device {
        Device::Cpu => "prompt: CPU forward pass".into(),
        d => format!(
            "prompt: every operation on {d} (embedding, norms, products, RoPE, KV cache, \
             attention, activations, residuals, logits); a walk-FFN or MoE layer (see its FFN \
             above) runs its FFN on the host, its input and output copied"
        ),
    }
}

/// Where single tokens run, in words: the `decode: …` line of `--explain` and of `bench`.
pub fn decode_mode(args: &DeviceArgs) -> String {
    match args.device {
        Device::Cpu => "CPU forward loop".into(),
        d => format!(
            "the forward pass's operations on {d}, each step replayed as a CUDA graph (greedy: \
             the next step launched from the device's choice before the host reads it)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!("CUDA".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse::<Device>(), Ok(Device::Cuda(3)));
        assert!("cuda:x".parse::<Device>().is_err());
        assert!("metal".parse::<Device>().is_err());
        assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
    }

    #[test]
    fn cpu_backend_is_the_default() {
        let b = DeviceArgs::default().backend().expect("cpu backend");
        assert_eq!(b.name(), CpuBackend::new().name());
        assert_eq!(b.kv_type(), KvType::F32);
    }

    #[test]
    fn cpu_refuses_a_kv_type_it_cannot_store() {
        let mut a = DeviceArgs {
            kv_type: Some(KvType::F32),
            ..DeviceArgs::default()
        };
        assert!(a.backend().is_ok());
        a.kv_type = Some(KvType::F16);
        assert_eq!(a.backend().expect("f16 on the cpu").kv_type(), KvType::F16);
        a.kv_type = Some(KvType::Q8_0);
        assert!(a.check().is_err(), "refused before anything is loaded");
        let e = a.backend().err().expect("an error").to_string();
        assert!(
            e.contains("--kv-type q8_0") && e.contains("--device cuda"),
            "{e}"
        );
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_a_clear_error() {
        let a = DeviceArgs {
            device: Device::Cuda(0),
            kv_type: None,
        };
        let e = a.backend().err().expect("an error").to_string();
        assert_eq!(e, NO_CUDA);
    }
}
