//! The kernel choice of the elliptic-curve operations, X25519 key shares and
//! P-256 signatures: each has an AVX-512 IFMA kernel, 8 operations per pass
//! in the lanes of zmm registers, and a portable constant-time one, the
//! reference the tests compare it with.

use crate::bn::LANES;

/// Which kernel computes a batch of curve operations ([`crate::X25519Kernel`]
/// and [`crate::P256Kernel`] are this type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CurveKernel {
    /// AVX-512 IFMA, 8 operations per pass (radix 2^52).
    Ifma,
    /// Portable constant-time Rust (u128 products), one at a time.
    Portable,
}

/// Whether this CPU runs the IFMA kernels: AVX-512F and AVX-512 IFMA.
#[cfg(target_arch = "x86_64")]
pub(crate) fn ifma_detected() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512ifma")
}

impl CurveKernel {
    /// Every kernel, fastest first.
    pub const ALL: [CurveKernel; 2] = [CurveKernel::Ifma, CurveKernel::Portable];

    /// The fastest kernel this CPU supports.
    pub fn detect() -> CurveKernel {
        CurveKernel::ALL
            .into_iter()
            .find(|k| k.is_available())
            .unwrap_or(CurveKernel::Portable)
    }

    /// Whether this CPU can run the kernel (detected at run time).
    pub fn is_available(self) -> bool {
        match self {
            CurveKernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            CurveKernel::Ifma => ifma_detected(),
            #[cfg(not(target_arch = "x86_64"))]
            CurveKernel::Ifma => false,
        }
    }

    /// The kernel's name in configuration and logs (`avx512ifma`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            CurveKernel::Ifma => "avx512ifma",
            CurveKernel::Portable => "portable",
        }
    }

    /// The kernel with this name (as `name` gives it).
    pub fn from_name(name: &str) -> Option<CurveKernel> {
        CurveKernel::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Operations one pass computes together (a batch of this many costs the
    /// same as a batch of one).
    pub fn lanes(self) -> usize {
        match self {
            CurveKernel::Ifma => LANES,
            CurveKernel::Portable => 1,
        }
    }
}
