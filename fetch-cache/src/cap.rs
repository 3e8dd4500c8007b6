//! A byte cap on one body, shared by fetches and egress: a declared length is judged
//! before the first byte is read, and every chunk is counted as it arrives, so that a
//! body past the cap is never buffered past it, whatever its headers claimed.

/// A body went past its cap (the caller names the limit in its own error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Over;

#[derive(Debug, Clone, Copy)]
pub(crate) struct ByteCap {
    max: u64,
    seen: u64,
}

impl ByteCap {
    pub(crate) fn new(max: u64) -> ByteCap {
        ByteCap { max, seen: 0 }
    }

    pub(crate) fn max(&self) -> u64 {
        self.max
    }

    pub(crate) fn seen(&self) -> u64 {
        self.seen
    }

    /// Refuses a body whose declared length (a `Content-Length`, an object's size) is
    /// past what is left, before any of it is read.
    pub(crate) fn declared(&self, length: Option<u64>) -> Result<(), Over> {
        match length {
            Some(length) if length > self.max.saturating_sub(self.seen) => Err(Over),
            _ => Ok(()),
        }
    }

    /// Counts `n` more bytes; past the cap, the chunk that crossed it is refused.
    pub(crate) fn count(&mut self, n: usize) -> Result<(), Over> {
        self.seen = self.seen.saturating_add(n as u64);
        if self.seen > self.max {
            Err(Over)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declared_length_is_judged_against_what_is_left() {
        let mut cap = ByteCap::new(10);
        assert_eq!(cap.declared(Some(10)), Ok(()));
        assert_eq!(cap.declared(Some(11)), Err(Over));
        assert_eq!(cap.declared(None), Ok(()));
        cap.count(4).unwrap();
        assert_eq!(cap.declared(Some(6)), Ok(()));
        assert_eq!(cap.declared(Some(7)), Err(Over));
    }

    #[test]
    fn counting_stops_at_the_first_byte_past_the_cap() {
        let mut cap = ByteCap::new(10);
        assert_eq!(cap.count(10), Ok(()));
        assert_eq!(cap.count(0), Ok(()));
        assert_eq!(cap.count(1), Err(Over));
        assert_eq!(cap.seen(), 11);
        assert_eq!(ByteCap::new(0).count(1), Err(Over));
    }
}
