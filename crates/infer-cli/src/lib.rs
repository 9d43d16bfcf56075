//! The library side of `infer`: the parts other crates link, i.e. the request parsing of
//! `infer serve` and its error type, shared by the `infer` binary (`src/main.rs`) and the
//! `serve_request` fuzz target (`fuzz/`).

/// `infer serve`'s request bodies ([`serve::params`]: JSON into a checked generation
/// request) and OpenAI-style errors ([`serve::error`]). The rest of the server is in the
/// binary (`src/serve/`).
pub mod serve {
    pub mod error;
    pub mod params;
}
