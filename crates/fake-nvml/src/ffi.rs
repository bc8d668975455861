//! What every export shares: the panic barrier, checked out-pointers, C strings.

use std::ffi::c_char;
use std::os::raw::c_uint;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::codes::{self, Ret};
use crate::state::R;

/// Runs an export's body. A panic must never unwind into C (that is undefined behaviour),
/// so it becomes NVML_ERROR_UNKNOWN, the code for "any unexpected error".
pub fn guard(body: impl FnOnce() -> R) -> Ret {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => codes::SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => codes::UNKNOWN,
    }
}

/// An out-parameter that was checked to be non-null and aligned.
pub struct Out<T>(*mut T);

impl<T> Out<T> {
    /// # Safety
    /// A non-null `ptr` must be valid for writing a `T` for the rest of the call, as NVML's
    /// contract requires of its callers.
    pub unsafe fn new(ptr: *mut T) -> R<Out<T>> {
        if ptr.is_null() || !ptr.is_aligned() {
            return Err(codes::INVALID_ARGUMENT);
        }
        Ok(Out(ptr))
    }

    pub fn set(&self, value: T) {
        // SAFETY: checked non-null and aligned in `new`, valid per `new`'s contract.
        unsafe { self.0.write(value) }
    }

    pub fn as_ptr(&self) -> *mut T {
        self.0
    }
}

impl<T: Copy> Out<T> {
    /// For in/out parameters such as `infoCount`.
    pub fn get(&self) -> T {
        // SAFETY: as for `set`; the caller initialised the value it passes in.
        unsafe { self.0.read() }
    }
}

/// A caller's `char *buf` of `length` bytes.
pub struct CBuf {
    ptr: *mut c_char,
    len: usize,
}

impl CBuf {
    /// # Safety
    /// A non-null `ptr` must be valid for writing `length` bytes.
    pub unsafe fn new(ptr: *mut c_char, length: c_uint) -> R<CBuf> {
        if ptr.is_null() || length == 0 {
            return Err(codes::INVALID_ARGUMENT);
        }
        let len = usize::try_from(length).map_err(|_| codes::INVALID_ARGUMENT)?;
        Ok(CBuf { ptr, len })
    }

    /// Copies `s` and a NUL; INSUFFICIENT_SIZE when they do not fit, as NVML's string
    /// queries (name, UUID, versions, serial) document.
    pub fn write(&self, s: &str) -> R {
        if s.len() >= self.len {
            return Err(codes::INSUFFICIENT_SIZE);
        }
        self.copy(s.as_bytes());
        Ok(())
    }

    /// Copies as much of `s` as fits and a NUL, as `nvmlSystemGetProcessName` does ("cropped
    /// to the provided length").
    pub fn write_truncated(&self, s: &str) {
        let n = s.len().min(self.len - 1);
        self.copy(&s.as_bytes()[..n]);
    }

    fn copy(&self, bytes: &[u8]) {
        debug_assert!(bytes.len() < self.len);
        // SAFETY: `bytes.len() + 1 <= self.len`, the writable size promised in `new`.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.cast::<u8>(), bytes.len());
            self.ptr.add(bytes.len()).write(0);
        }
    }
}

/// Fills a fixed `char[N]` inside a struct, truncating, always NUL-terminated.
pub fn fill_array<const N: usize>(array: &mut [c_char; N], s: &str) {
    let n = s.len().min(N.saturating_sub(1));
    for (dst, src) in array.iter_mut().zip(&s.as_bytes()[..n]) {
        *dst = *src as c_char;
    }
    for dst in array.iter_mut().skip(n) {
        *dst = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_turns_panics_into_unknown() {
        assert_eq!(guard(|| Ok(())), codes::SUCCESS);
        assert_eq!(guard(|| Err(codes::NOT_FOUND)), codes::NOT_FOUND);
        assert_eq!(guard(|| panic!("boom")), codes::UNKNOWN);
    }

    #[test]
    fn out_checks_pointers() {
        // SAFETY: null and a misaligned address are rejected before any write.
        unsafe {
            assert!(Out::<u32>::new(std::ptr::null_mut()).is_err());
            let mut words = [0u32; 2];
            let misaligned = words.as_mut_ptr().cast::<u8>().add(1).cast::<u32>();
            assert!(Out::new(misaligned).is_err());
            let out = Out::new(&mut words[0]).expect("valid");
            out.set(7);
            assert_eq!(out.get(), 7);
        }
    }

    #[test]
    fn strings() {
        let mut buf = [b'x' as c_char; 8];
        // SAFETY: `buf` has 8 writable bytes.
        let cbuf = unsafe { CBuf::new(buf.as_mut_ptr(), 8) }.expect("buffer");
        assert_eq!(cbuf.write("12345678"), Err(codes::INSUFFICIENT_SIZE));
        assert_eq!(cbuf.write("1234567"), Ok(()));
        assert_eq!(buf[7], 0);
        let cbuf = unsafe { CBuf::new(buf.as_mut_ptr(), 4) }.expect("buffer");
        cbuf.write_truncated("abcdef");
        assert_eq!(
            &buf[..4],
            &[b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]
        );
        assert!(unsafe { CBuf::new(buf.as_mut_ptr(), 0) }.is_err());
        assert!(unsafe { CBuf::new(std::ptr::null_mut(), 8) }.is_err());
        let mut array = [1 as c_char; 4];
        fill_array(&mut array, "0000:00:06.0");
        assert_eq!(array, [b'0' as c_char, b'0' as c_char, b'0' as c_char, 0]);
    }
}
