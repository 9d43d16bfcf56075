//! The CPU backend's whole operations against scalar references ([`common::ops_parity`]), with
//! the fastest kernels of this CPU and with the generic (scalar) ones.

mod common;

use infer_compute::{CpuBackend, Isa};

#[test]
fn cpu_backend_operations_match_scalar_references() {
    common::ops_parity::check_backend_ops(&CpuBackend::new());
}

#[test]
fn generic_cpu_backend_operations_match_scalar_references() {
    let generic = CpuBackend::with_isa(Isa::Generic).expect("the generic ISA is always available");
    common::ops_parity::check_backend_ops(&generic);
}
