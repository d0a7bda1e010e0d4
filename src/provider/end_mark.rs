//! End marks: how a reader learns that an output stream arrived whole over a transport that
//! may cut its tail off and still report success.
//!
//! The Pod `exec` path does that. When the process ends while its last bytes are still on
//! the way to a slow reader, the container runtime's streaming server closes its connection
//! to the kubelet at once; if a ping the kubelet sent is still unread there, the close
//! resets the connection, and the bytes the kubelet had not read yet are gone, together with
//! the exit status behind them — and an exec whose status never came counts as a success.
//! (Seen with Kubernetes 1.36 and containerd 1.6, through `kubectl exec` too.) So the
//! wrapper writes a mark unique to the session after the program's output on each stream
//! and waits for the reader's word before it exits
//! ([`crate::provider::interactive::wrap_marked`]): the runtime keeps the connection until
//! the reader has everything. The reader takes the mark out of the stream and counts the
//! stream whole only if it saw it.

use bytes::{Bytes, BytesMut};

/// Takes one end mark out of a stream read in chunks, wherever the chunks split it. Bytes
/// after the mark (a background child still writing) pass on unchanged.
#[derive(Debug)]
pub struct EndMark {
    mark: Bytes,
    /// Bytes held back because they may be the start of the mark.
    held: BytesMut,
    seen: bool,
}

impl EndMark {
    /// A reader looking for `mark` (not empty).
    pub fn new(mark: impl Into<Bytes>) -> Self {
        Self {
            mark: mark.into(),
            held: BytesMut::new(),
            seen: false,
        }
    }

    /// Whether the mark has gone by.
    pub fn seen(&self) -> bool {
        self.seen
    }

    /// The next chunk in; the bytes to pass on out (the mark taken out, and a tail that
    /// begins it held back).
    pub fn pass(&mut self, chunk: &[u8]) -> Bytes {
        if self.seen {
            return Bytes::copy_from_slice(chunk);
        }
        self.held.extend_from_slice(chunk);
        if let Some(at) = find(&self.held, &self.mark) {
            self.seen = true;
            let mut out = self.held.split();
            let after = out.split_off(at).split_off(self.mark.len());
            out.unsplit(after);
            return out.freeze();
        }
        // Only a tail that begins the mark waits: a prompt or a handshake's answer must not
        // wait for output that may never come.
        let keep = (1..self.mark.len())
            .rev()
            .find(|&k| self.held.ends_with(&self.mark[..k]))
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        self.held.split_to(cut).freeze()
    }

    /// At the stream's end: what was held back (a prefix of the mark that never completed
    /// is the program's own output).
    pub fn finish(&mut self) -> Bytes {
        self.held.split().freeze()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in chunks of `size` and returns what passed and whether the mark did.
    fn through(input: &[u8], size: usize) -> (Vec<u8>, bool) {
        let mut end = EndMark::new(&b"<end:42>"[..]);
        let mut out = Vec::new();
        for chunk in input.chunks(size) {
            out.extend_from_slice(&end.pass(chunk));
        }
        out.extend_from_slice(&end.finish());
        (out, end.seen())
    }

    #[test]
    fn the_mark_is_taken_out_wherever_the_chunks_split_it() {
        let input = b"hello world\n<end:42>";
        for size in 1..=input.len() {
            assert_eq!(
                through(input, size),
                (b"hello world\n".to_vec(), true),
                "chunks of {size}"
            );
        }
    }

    #[test]
    fn output_after_the_mark_passes_on_and_a_missing_mark_is_told() {
        assert_eq!(through(b"a<end:42>late", 3), (b"alate".to_vec(), true));
        assert_eq!(through(b"cut sho", 2), (b"cut sho".to_vec(), false));
        assert_eq!(
            through(b"x<end:4", 4),
            (b"x<end:4".to_vec(), false),
            "a mark's prefix at the end is output, not a mark"
        );
        assert_eq!(through(b"<end:42>", 8), (Vec::new(), true));
    }

    #[test]
    fn nothing_is_held_back_beyond_what_could_begin_the_mark() {
        let mut end = EndMark::new(&b"<end:42>"[..]);
        assert_eq!(&end.pass(b"$ ")[..], b"$ ", "a prompt passes at once");
        assert_eq!(
            &end.pass(b"abc<en")[..],
            b"abc",
            "only what begins the mark waits"
        );
        assert_eq!(
            &end.pass(b"d!")[..],
            b"<end!",
            "and passes once it does not"
        );
    }
}
