//! Hooks for the valgrind constant-time check (`ct/run.sh`).
//!
//! With the `ct-valgrind` feature these issue memcheck client requests:
//! `mark_secret` makes memory "undefined", so memcheck reports any branch or
//! address computed from it; `declassify` makes the public-key-checked result
//! "defined" again before it leaves the engine. Without the feature, and
//! outside valgrind, they do nothing.
//!
//! The engine calls them on its own secrets; the feature `test-hooks` exports
//! this module so that the harness (`ct/ct_check.rs`) can mark its inputs too.

#[cfg(all(feature = "ct-valgrind", target_arch = "x86_64"))]
mod imp {
    // VG_USERREQ_TOOL_BASE('M','C') + n, from valgrind's memcheck.h.
    const MAKE_MEM_UNDEFINED: u64 = 0x4d43_0001;
    const MAKE_MEM_DEFINED: u64 = 0x4d43_0002;

    fn client_request(req: u64, addr: *const u8, len: usize) {
        let args: [u64; 6] = [req, addr as u64, len as u64, 0, 0, 0];
        let mut _res: u64 = 0;
        // SAFETY: the "magic sequence" of valgrind's client requests for
        // amd64 (valgrind.h): four rotations of rdi that add up to 128 bits
        // (rdi is unchanged) and `xchg rbx, rbx`, a no-op on a real CPU.
        // Valgrind reads `args` through rax; it only changes the memcheck
        // state of [addr, addr+len), which the caller borrows.
        unsafe {
            core::arch::asm!(
                "rol rdi, 3", "rol rdi, 13", "rol rdi, 61", "rol rdi, 51",
                "xchg rbx, rbx",
                inout("rdx") 0u64 => _res,
                in("rax") args.as_ptr(),
                inout("rdi") 0u64 => _,
                options(nostack)
            );
        }
    }

    /// Marks `x` undefined for memcheck: secret from here on.
    pub fn mark_secret<T>(x: &[T]) {
        client_request(
            MAKE_MEM_UNDEFINED,
            x.as_ptr().cast(),
            core::mem::size_of_val(x),
        );
    }
    /// Marks `x` defined again for memcheck: public from here on.
    pub fn declassify<T>(x: &[T]) {
        client_request(
            MAKE_MEM_DEFINED,
            x.as_ptr().cast(),
            core::mem::size_of_val(x),
        );
    }
}

#[cfg(not(all(feature = "ct-valgrind", target_arch = "x86_64")))]
mod imp {
    /// Marks `x` secret for memcheck: a no-op in this build.
    pub fn mark_secret<T>(_x: &[T]) {}
    /// Marks `x` public again for memcheck: a no-op in this build.
    pub fn declassify<T>(_x: &[T]) {}
}

pub use imp::{declassify, mark_secret};

/// `x`, declassified: stored, declassified, and read back from memory. A
/// plain `declassify` of a local lets the compiler keep testing the register
/// that still holds the marked value (memcheck then reports the branch, as
/// it did for the X25519 all-zero check); the volatile read makes the branch
/// use the declassified copy.
pub fn declassified<T: Copy>(x: T) -> T {
    let v = [x];
    declassify(&v);
    // SAFETY: `v[0]` is a live, aligned, initialized local of type T.
    unsafe { core::ptr::read_volatile(&v[0]) }
}

/// Overwrites the stack below the caller's frame, where a kernel kept its
/// state and spilled registers (scalar bits, nonces, intermediate points):
/// the kernels' locals cannot be wiped one by one. `black_box` keeps the
/// zeroing from being removed as dead stores.
#[inline(never)]
pub(crate) fn wipe_stack() {
    let mut buf = [0u64; 2048];
    core::hint::black_box(&mut buf);
}
