//! A process's recent output, bounded (pure: no I/O, table-tested). Every chunk gets a
//! sequence number; readers keep a cursor (the next number they want), so a reader that
//! attaches late — a `Connect` after the client that started the process went away — reads
//! what is still kept, and a live reader never misses a chunk: the buffer only drops chunks
//! every attached reader has passed (see [`Ring::push`]).

use std::collections::VecDeque;

use bytes::Bytes;

/// The output kept per process for a reattach: the last 1 MiB; older chunks are dropped
/// first, and only once every attached reader has read them.
pub const REPLAY_BYTES: usize = 1 << 20;

/// One chunk of output, by the stream it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// The process's stdout.
    Stdout(Bytes),
    /// Its stderr.
    Stderr(Bytes),
    /// Its terminal's output (a PTY has one stream).
    Pty(Bytes),
}

impl Chunk {
    /// Its bytes.
    pub fn bytes(&self) -> &Bytes {
        match self {
            Chunk::Stdout(b) | Chunk::Stderr(b) | Chunk::Pty(b) => b,
        }
    }
}

/// The kept chunks, numbered from [`Ring::first`].
#[derive(Debug)]
pub struct Ring {
    chunks: VecDeque<Chunk>,
    first: u64,
    bytes: usize,
    cap: usize,
}

impl Ring {
    /// An empty buffer keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Ring {
            chunks: VecDeque::new(),
            first: 0,
            bytes: 0,
            cap,
        }
    }

    /// The number of the oldest chunk kept.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// The number the next chunk will get.
    pub fn next(&self) -> u64 {
        self.first + self.chunks.len() as u64
    }

    /// Adds `chunk`, dropping the oldest chunks numbered below `keep_from` (what every
    /// attached reader has read) until it fits. `false`, and nothing changed, when it would
    /// have to drop a chunk numbered `keep_from` or later: the writer then waits for a
    /// reader. A chunk larger than the whole buffer is kept alone.
    pub fn push(&mut self, chunk: Chunk, keep_from: u64) -> bool {
        let len = chunk.bytes().len();
        let mut droppable = 0;
        let mut freed = 0;
        for (i, c) in self.chunks.iter().enumerate() {
            if self.bytes - freed + len <= self.cap {
                break;
            }
            if self.first + i as u64 >= keep_from {
                return false;
            }
            droppable += 1;
            freed += c.bytes().len();
        }
        for _ in 0..droppable {
            self.chunks.pop_front();
        }
        self.first += droppable as u64;
        self.bytes = self.bytes - freed + len;
        self.chunks.push_back(chunk);
        true
    }

    /// Up to `max` chunks from number `from` (from the oldest kept, when `from` was dropped),
    /// and the number after the last one returned.
    pub fn read(&self, from: u64, max: usize) -> (Vec<Chunk>, u64) {
        let start = from.max(self.first);
        let skip = (start - self.first) as usize;
        let chunks: Vec<Chunk> = self.chunks.iter().skip(skip).take(max).cloned().collect();
        let after = start + chunks.len() as u64;
        (chunks, after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(n: usize) -> Chunk {
        Chunk::Stdout(Bytes::from(vec![b'x'; n]))
    }

    #[test]
    fn readers_get_every_chunk_in_order_from_their_cursor() {
        let mut ring = Ring::new(100);
        assert!(ring.push(Chunk::Stdout(Bytes::from_static(b"a")), 0));
        assert!(ring.push(Chunk::Stderr(Bytes::from_static(b"b")), 0));
        assert!(ring.push(Chunk::Pty(Bytes::from_static(b"c")), 0));
        let (all, after) = ring.read(0, 10);
        assert_eq!(after, 3);
        assert_eq!(
            all,
            vec![
                Chunk::Stdout(Bytes::from_static(b"a")),
                Chunk::Stderr(Bytes::from_static(b"b")),
                Chunk::Pty(Bytes::from_static(b"c"))
            ]
        );
        assert_eq!(ring.read(1, 1), (vec![Chunk::Stderr("b".into())], 2));
        assert_eq!(ring.read(3, 10), (vec![], 3));
    }

    #[test]
    fn without_readers_the_oldest_output_is_dropped_to_stay_within_the_bound() {
        let mut ring = Ring::new(100);
        for _ in 0..10 {
            assert!(ring.push(out(30), u64::MAX));
        }
        // 3 chunks of 30 fit in 100: the 7 oldest are gone.
        assert_eq!((ring.first(), ring.next()), (7, 10));
        let (kept, after) = ring.read(0, 100);
        assert_eq!(
            (kept.len(), after),
            (3, 10),
            "a dropped cursor reads from the oldest"
        );
    }

    #[test]
    fn an_unread_chunk_is_never_dropped_the_writer_waits_instead() {
        let mut ring = Ring::new(100);
        assert!(ring.push(out(40), 0));
        assert!(ring.push(out(40), 0));
        assert!(
            !ring.push(out(40), 0),
            "the reader at 0 has not read chunk 0"
        );
        assert_eq!((ring.first(), ring.next()), (0, 2), "nothing changed");
        assert!(ring.push(out(40), 1), "chunk 0 has been read");
        assert_eq!((ring.first(), ring.next()), (1, 3));
    }

    #[test]
    fn a_chunk_larger_than_the_bound_is_kept_alone() {
        let mut ring = Ring::new(10);
        assert!(ring.push(out(4), u64::MAX));
        assert!(ring.push(out(25), u64::MAX));
        assert_eq!((ring.first(), ring.next()), (1, 2));
        assert!(ring.push(out(1), u64::MAX));
        assert_eq!((ring.first(), ring.next()), (2, 3));
    }
}
