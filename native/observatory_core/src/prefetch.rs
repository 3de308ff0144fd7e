//! Asking the CPU to start loading memory that is about to be read.
//!
//! A session's state is cold in a gateway holding many sessions: each line it reads is
//! a wait of its own when the reads come one after the other (a ring read after the
//! record that points to it, a scan after rules that read other fields). Prefetched
//! together, the waits overlap. It changes no answer: a prefetch reads nothing the
//! program sees, and on other architectures it does nothing.

/// Starts loading every cache line of `data`.
#[inline]
pub fn slice<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(data);
        let start = data.as_ptr().cast::<i8>();
        let mut offset = 0;
        while offset < bytes {
            // SAFETY: a prefetch never faults, and the address is inside `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
            offset += 64;
        }
        if bytes > 0 {
            // The last line, when `data` does not start on a line's boundary.
            // SAFETY: as above; the last byte of `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(bytes - 1)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

#[cfg(test)]
mod tests {
    #[test]
    fn any_slice_is_prefetched_without_effect() {
        let data: Vec<u64> = (0..100).collect();
        super::slice(&data);
        super::slice(&data[3..5]);
        super::slice::<u64>(&[]);
        assert_eq!(data.iter().sum::<u64>(), 4950);
    }
}
