//! Re-writing a tenant-authored tar archive into one that is safe to extract.
//!
//! Every tar archive the operator hands to an extractor passes through here: a
//! `BulkFiles::import` from a caller, and the Docker capture that copies a sandbox's mounted
//! paths into a template image. Either is tenant-authored data. Extracting it verbatim would
//! honour whatever it says: absolute member names, `..` traversal, hard links to files outside
//! the destination, writes through symlinks, setuid/setgid bits, ownership, file capabilities
//! carried as extended attributes in PAX records, device nodes. This module reads such an
//! archive and writes a NEW one that says only what is safe, so the extractor downstream
//! (Docker's archive endpoint) never sees the hostile fields at all:
//!
//! - member names that are absolute or contain a `..` component are refused (the whole
//!   archive is rejected: a partial extraction of a hostile archive is not a useful outcome);
//! - hard links are refused unless their target is a file written EARLIER in the same
//!   archive (as tar itself writes them): a link to any other name — absolute, with `..`, or
//!   a plain `etc/shadow` that the archive never contained — would link to whatever the
//!   destination already holds under that name;
//! - symbolic links are kept, but an entry whose path (or hard-link target) passes THROUGH a
//!   symlink created earlier in the same archive is refused — that is the classic "create
//!   `link -> /etc`, then write `link/passwd`" escape, and it is refused even though Docker
//!   extracts inside the container root, because the archive's author clearly did not mean a
//!   plain tree;
//! - device and fifo entries and PAX global headers are dropped (and counted); any other
//!   entry type is refused;
//! - permission bits are masked to `0o777`: setuid, setgid and the sticky bit never survive;
//! - ownership is never restored: every entry is written with uid = gid = 0 and empty
//!   user/group names;
//! - nothing else from the input header crosses: PAX records (extended attributes such as
//!   `security.capability`, ACLs) are not copied, because the output headers are built from
//!   scratch. Long names and long link targets are re-encoded as GNU long-name entries;
//! - a `.` entry (the destination directory itself) is dropped, because extracting it would
//!   re-mode and re-own the destination;
//! - an archive that ends inside a file is an error, never a shorter file.
//!
//! Archives are streamed ([`sanitise_into`]): a capture of a large tree never has to fit in
//! memory. An upload is read as it arrives ([`sanitise_pieces`]), and the files it keeps are
//! handed on as slices of what arrived.
//!
//! The template restore of a provider without image commit (rule 11) runs inside the
//! restoring sandbox and is a separate, stronger boundary: it additionally confines extraction
//! to the manifest's capture paths, refuses writes through symlinks the sandbox already has,
//! and asserts the result after extraction (`templates::manifest::restore_script`).

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use bytes::{Bytes, BytesMut};
use tar::{Archive, Builder, Entry, EntryType, Header};

/// Mode given to directories this module creates itself (the destination prefix).
const PREFIX_DIR_MODE: u32 = 0o755;

/// Why an archive was refused. The message names the offending member, for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TarsafeError(pub String);

/// What was changed on the way through.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// Entries written (prefix directories included).
    pub entries: usize,
    /// Names of entries that were dropped (devices, fifos, `.`), for a log line.
    pub dropped: Vec<String>,
    /// How many entries had setuid/setgid/sticky bits cleared.
    pub special_bits_cleared: usize,
    /// How many entries carried a non-root owner that was not restored.
    pub ownership_reset: usize,
}

/// A sanitised archive held in memory, and what was changed on the way.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sanitised {
    /// The re-written archive (uncompressed POSIX/GNU tar).
    pub archive: Vec<u8>,
    /// What was changed.
    pub report: Report,
}

/// Where the members of the sanitised archive go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement<'a> {
    /// Relative directory (`""` for none) prepended to every member name and hard-link
    /// target, so an archive can be extracted below directories while uploading at an
    /// ancestor.
    pub prefix: &'a str,
    /// How many of the prefix's LAST components are emitted first as directory entries
    /// (mode `0o755`, root-owned): the ones that do not exist where the archive is extracted.
    /// The others already exist there and are left as they are (an entry for them would
    /// re-mode and re-own them).
    pub create_dirs: usize,
}

impl<'a> Placement<'a> {
    /// Every member under `prefix`, each of whose directories is created.
    pub fn under(prefix: &'a str) -> Self {
        Placement {
            prefix,
            create_dirs: usize::MAX,
        }
    }
}

/// Splits a tar member name into its normal components.
///
/// Empty and `.` components are skipped (`./a//b` is `a/b`); an absolute name or a `..`
/// component is refused. `what` names the field for the error message.
fn components<'a>(what: &str, raw: &'a [u8]) -> Result<Vec<&'a [u8]>, TarsafeError> {
    let shown = String::from_utf8_lossy(raw);
    if raw.first() == Some(&b'/') {
        return Err(TarsafeError(format!(
            "archive {what} {shown:?} is absolute; archive members must be relative to the destination"
        )));
    }
    let mut out = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                return Err(TarsafeError(format!(
                    "archive {what} {shown:?} contains a '..' component; it would escape the destination"
                )));
            }
            normal => out.push(normal),
        }
    }
    Ok(out)
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&b'/')
}

fn as_path(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

fn io_err(context: &str, e: io::Error) -> TarsafeError {
    TarsafeError(format!(
        "{context}: {e}; send an uncompressed POSIX tar archive"
    ))
}

/// A fresh header of the given type, owned by root, with only the fields we choose.
fn fresh_header(kind: EntryType, mode: u32, mtime: u64, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h.set_size(size);
    h
}

/// Reads exactly `left` bytes from `inner`: an input that ends early is an error, so a
/// truncated archive never becomes a shorter file in the output.
struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let cap = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..cap])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the archive ends inside a file",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Re-writes `input` into a safe archive, every member placed under `prefix` (each of whose
/// directories is emitted first). The in-memory form of [`sanitise_into`].
pub fn sanitise(input: &[u8], prefix: &str) -> Result<Sanitised, TarsafeError> {
    // The output is the input's size give or take a few headers: sized once, never regrown
    // (regrowing a 64 MiB archive copies it again at every doubling).
    let mut archive = Vec::with_capacity(input.len() + 64 * 1024);
    let report = sanitise_into(input, &mut archive, Placement::under(prefix))?;
    Ok(Sanitised { archive, report })
}

/// Streams `input` into `output` as a safe archive (see the module docs), placing every
/// member as `placement` says. Nothing is written for an archive that is refused only when
/// the refusal comes before the first member: callers write to a temporary place and use the
/// output only on `Ok`.
pub fn sanitise_into(
    input: impl Read,
    output: impl Write,
    placement: Placement<'_>,
) -> Result<Report, TarsafeError> {
    let mut archive = Archive::new(input);
    let entries = archive
        .entries()
        .map_err(|e| io_err("reading the archive", e))?;
    let (report, _) = rewrite(entries, Copied(output), placement)?;
    Ok(report)
}

/// A sanitised archive as pieces: the headers and padding this module made, and the file
/// data as slices of the pieces the input arrived in (never copied).
#[derive(Debug, Clone, Default)]
pub struct Pieces {
    /// The re-written archive, in order.
    pub pieces: Vec<Bytes>,
    /// What was changed.
    pub report: Report,
}

impl Pieces {
    /// The archive in one buffer, for a consumer that needs it whole (this copies it).
    pub fn to_vec(&self) -> Vec<u8> {
        self.pieces.concat()
    }
}

/// [`sanitise`] of an archive that arrives in pieces (`input`, read as they come), into
/// [`Pieces`]. Why: an upload is checked while it is still arriving, and its file data is
/// handed on as slices of what arrived rather than re-written: for a large upload the copy
/// and the fresh output buffer were most of the sanitiser's cost. Every piece is kept until
/// the archive has been read to its end, so the output holds no more than the input did.
pub fn sanitise_pieces(
    input: impl Iterator<Item = io::Result<Bytes>>,
    prefix: &str,
) -> Result<Pieces, TarsafeError> {
    let mut archive = Archive::new(Arrived::new(input));
    let entries = archive
        .entries_with_seek()
        .map_err(|e| io_err("reading the archive", e))?;
    let (report, segments) = rewrite(entries, Segments::default(), Placement::under(prefix))?;
    let arrived = archive.into_inner();
    let pieces = segments
        .resolve(&arrived)
        .map_err(|e| io_err("reading the archive", e))?;
    Ok(Pieces { pieces, report })
}

/// The rewrite itself, the one implementation of the rules above: every entry of `entries`
/// refused, dropped or written to `output`. Returns the output once the archive is finished.
fn rewrite<'a, R: Read + 'a, S: Sink>(
    entries: impl Iterator<Item = io::Result<Entry<'a, R>>>,
    output: S,
    placement: Placement<'_>,
) -> Result<(Report, S), TarsafeError> {
    let prefix = components("destination prefix", placement.prefix.as_bytes())?;
    let mut writer = Rewriter {
        out: Builder::new(output),
        prefix,
        symlinks: HashSet::new(),
        files: HashSet::new(),
        report: Report::default(),
    };
    writer.prefix_dirs(placement.create_dirs)?;
    for entry in entries {
        let entry = entry.map_err(|e| io_err("reading an archive entry", e))?;
        writer.entry(entry)?;
    }
    let Rewriter { out, report, .. } = writer;
    let mut output = out
        .into_inner()
        .map_err(|e| io_err("finishing the archive", e))?;
    output
        .flush()
        .map_err(|e| io_err("finishing the archive", e))?;
    Ok((report, output))
}

/// Where a rewrite writes: headers through `Write`, a file's data through [`Sink::file_data`].
trait Sink: Write {
    /// Appends the `size` bytes of a file's data and the padding that ends its last block.
    /// `data` reads them (exactly `size`, expanded when `sparse`); `position` is where they
    /// start in the input when they are stored there as they are (not `sparse`).
    fn file_data(
        &mut self,
        data: &mut dyn Read,
        position: u64,
        size: u64,
        sparse: bool,
    ) -> io::Result<()>;
}

/// Appends the zeros that end a block holding `len` bytes of data.
fn pad(out: &mut dyn Write, len: u64) -> io::Result<()> {
    let rest = (512 - len % 512) % 512;
    out.write_all(&[0u8; 512][..usize::try_from(rest).unwrap_or(0)])
}

/// A sink that copies file data through (a capture to a file, an archive in memory).
struct Copied<W>(W);

impl<W: Write> Write for Copied<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl<W: Write> Sink for Copied<W> {
    fn file_data(&mut self, data: &mut dyn Read, _: u64, size: u64, _: bool) -> io::Result<()> {
        let mut exact = Exact {
            inner: data,
            left: size,
        };
        io::copy(&mut exact, &mut self.0)?;
        pad(&mut self.0, size)
    }
}

/// A rewritten archive as it is made: the bytes this module writes (headers, padding, the
/// data of expanded sparse files), and ranges of the input where file data is kept as it
/// came. The ranges become slices of the input once all of it has arrived ([`Self::resolve`]).
#[derive(Default)]
struct Segments {
    made: BytesMut,
    segments: Vec<Segment>,
}

enum Segment {
    Made(Bytes),
    Input { position: u64, size: u64 },
}

impl Segments {
    /// Closes the bytes made so far into a segment of their own.
    fn seal(&mut self) {
        if !self.made.is_empty() {
            let made = self.made.split().freeze();
            self.segments.push(Segment::Made(made));
        }
    }

    /// The archive as slices: made bytes as they are, input ranges cut from `arrived`.
    fn resolve(mut self, arrived: &Arrived<impl Iterator>) -> io::Result<Vec<Bytes>> {
        self.seal();
        let mut out = Vec::with_capacity(self.segments.len());
        for segment in self.segments {
            match segment {
                Segment::Made(bytes) => out.push(bytes),
                Segment::Input { position, size } => arrived.slices(position, size, &mut out)?,
            }
        }
        Ok(out)
    }
}

impl Write for Segments {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.made.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Sink for Segments {
    fn file_data(
        &mut self,
        data: &mut dyn Read,
        position: u64,
        size: u64,
        sparse: bool,
    ) -> io::Result<()> {
        if sparse {
            // Its data in the input is the sparse map's chunks: expand it, as a copy.
            Copied(&mut *self).file_data(data, position, size, sparse)
        } else {
            self.seal();
            self.segments.push(Segment::Input { position, size });
            pad(self, size)
        }
    }
}

/// An archive arriving in pieces, read on a blocking thread: the tar reader reads headers
/// from it and seeks over file data (which waits until that data has arrived, and fails when
/// the input ends first). Every piece is kept, so file data can be sliced from it later.
struct Arrived<I> {
    input: I,
    pieces: Vec<Bytes>,
    /// Where each piece ends in the input.
    ends: Vec<u64>,
    /// The piece `pos` is in (or the next to arrive).
    at: usize,
    pos: u64,
}

impl<I: Iterator<Item = io::Result<Bytes>>> Arrived<I> {
    fn new(input: I) -> Self {
        Arrived {
            input,
            pieces: Vec::new(),
            ends: Vec::new(),
            at: 0,
            pos: 0,
        }
    }

    /// How much has arrived.
    fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Waits for the next piece; `false` at the end of the input.
    fn more(&mut self) -> io::Result<bool> {
        loop {
            match self.input.next().transpose()? {
                None => return Ok(false),
                Some(piece) if piece.is_empty() => continue,
                Some(piece) => {
                    let end = self.len() + piece.len() as u64;
                    self.pieces.push(piece);
                    self.ends.push(end);
                    return Ok(true);
                }
            }
        }
    }

    /// Moves `at` to the piece that holds `pos`.
    fn settle(&mut self) {
        while self.ends.get(self.at).is_some_and(|end| *end <= self.pos) {
            self.at += 1;
        }
    }
}

impl<I> Arrived<I> {
    /// Appends the `size` bytes at `position` to `out`, as slices of the pieces they arrived in.
    fn slices(&self, position: u64, size: u64, out: &mut Vec<Bytes>) -> io::Result<()> {
        let (mut from, end) = (position, position + size);
        let mut at = self.ends.partition_point(|e| *e <= from);
        while from < end {
            let (Some(piece), Some(piece_end)) = (self.pieces.get(at), self.ends.get(at)) else {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the archive ends inside a file",
                ));
            };
            let start = piece_end - piece.len() as u64;
            let lo = usize::try_from(from - start).map_err(io::Error::other)?;
            let hi = usize::try_from(end.min(*piece_end) - start).map_err(io::Error::other)?;
            out.push(piece.slice(lo..hi));
            from = end.min(*piece_end);
            at += 1;
        }
        Ok(())
    }
}

impl<I: Iterator<Item = io::Result<Bytes>>> Read for Arrived<I> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.settle();
        if self.at == self.pieces.len() && !self.more()? {
            return Ok(0);
        }
        let (piece, end) = (&self.pieces[self.at], self.ends[self.at]);
        let offset =
            usize::try_from(self.pos - (end - piece.len() as u64)).map_err(io::Error::other)?;
        let n = buf.len().min(piece.len() - offset);
        buf[..n].copy_from_slice(&piece[offset..offset + n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl<I: Iterator<Item = io::Result<Bytes>>> Seek for Arrived<I> {
    /// Only forward from the current position (all the tar reader asks for): it waits for
    /// the input to reach the new position.
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let SeekFrom::Current(delta) = to else {
            return Err(io::Error::other("an arriving archive is only read forward"));
        };
        let target = u64::try_from(delta)
            .ok()
            .and_then(|d| self.pos.checked_add(d))
            .ok_or_else(|| io::Error::other("an arriving archive is only read forward"))?;
        while self.len() < target {
            if !self.more()? {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the archive ends inside a file",
                ));
            }
        }
        self.pos = target;
        Ok(target)
    }
}

/// The state of one rewrite: the output, the destination prefix, and the symlinks and files
/// the archive has created so far (relative to the prefix).
struct Rewriter<'p, W: Sink> {
    out: Builder<W>,
    prefix: Vec<&'p [u8]>,
    symlinks: HashSet<Vec<u8>>,
    /// Regular files written so far (relative to the prefix): what hard links may point at.
    files: HashSet<Vec<u8>>,
    report: Report,
}

/// One input member, reduced to what the output carries.
struct Member {
    shown: String,
    /// Relative to the prefix (what symlink tracking uses).
    relative: Vec<u8>,
    /// With the prefix (what is written).
    name: Vec<u8>,
    mode: u32,
    mtime: u64,
}

impl<W: Sink> Rewriter<'_, W> {
    /// Emits the last `count` directories of the prefix, outermost first.
    fn prefix_dirs(&mut self, count: usize) -> Result<(), TarsafeError> {
        let depth = self.prefix.len();
        for end in depth - count.min(depth) + 1..=depth {
            let mut h = fresh_header(EntryType::Directory, PREFIX_DIR_MODE, 0, 0);
            let name = join(&self.prefix[..end]);
            self.out
                .append_data(&mut h, as_path(&name), io::empty())
                .map_err(|e| io_err("writing a prefix directory", e))?;
            self.report.entries += 1;
        }
        Ok(())
    }

    /// Rewrites one entry: refused, dropped, or written with the safe fields only.
    fn entry<R: Read>(&mut self, mut entry: Entry<'_, R>) -> Result<(), TarsafeError> {
        let raw_name = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw_name).into_owned();
        let kind = entry.header().entry_type();
        if kind == EntryType::XGlobalHeader {
            self.report
                .dropped
                .push(format!("{shown} (pax global header)"));
            return Ok(());
        }
        refuse_pax_sparse(&mut entry, &shown)?;
        let parts = components("member", &raw_name)?;
        if parts.is_empty() {
            self.report
                .dropped
                .push(format!("{shown} (the destination itself)"));
            return Ok(());
        }
        self.not_through_symlink("member", &parts)?;
        let member = self.member(&entry, shown, &parts)?;
        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.file(&mut entry, &member)?;
            }
            EntryType::Directory => {
                let mut h = fresh_header(EntryType::Directory, member.mode, member.mtime, 0);
                self.write(&member, |out| {
                    out.append_data(&mut h, as_path(&member.name), io::empty())
                })?;
                self.symlinks.remove(&member.relative);
                self.files.remove(&member.relative);
            }
            EntryType::Symlink => self.symlink(&entry, &member)?,
            EntryType::Link => self.hard_link(&entry, &member)?,
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let dropped = format!("{} (device or fifo)", member.shown);
                self.report.dropped.push(dropped);
                return Ok(());
            }
            other => {
                return Err(TarsafeError(format!(
                    "archive member {:?} has unsupported entry type {other:?}; \
                     only files, directories, symlinks and hard links are accepted",
                    member.shown
                )));
            }
        }
        self.report.entries += 1;
        Ok(())
    }

    /// A regular file, its content streamed through (exactly as long as the header says).
    fn file<R: Read>(
        &mut self,
        entry: &mut Entry<'_, R>,
        member: &Member,
    ) -> Result<(), TarsafeError> {
        let size = entry.size();
        let position = entry.raw_file_position();
        let sparse = entry.header().entry_type() == EntryType::GNUSparse;
        // The header says `size`; the data follows it through the sink (written or kept).
        let mut h = fresh_header(EntryType::Regular, member.mode, member.mtime, size);
        self.write(member, |out| {
            out.append_data(&mut h, as_path(&member.name), io::empty())?;
            out.get_mut().file_data(entry, position, size, sparse)
        })?;
        self.symlinks.remove(&member.relative);
        self.files.insert(member.relative.clone());
        Ok(())
    }

    /// Reads the fields the output keeps, counting what it drops.
    fn member<R: Read>(
        &mut self,
        entry: &Entry<'_, R>,
        shown: String,
        parts: &[&[u8]],
    ) -> Result<Member, TarsafeError> {
        let header = entry.header();
        let raw_mode = header
            .mode()
            .map_err(|e| io_err(&format!("reading the mode of {shown:?}"), e))?;
        if raw_mode & 0o7000 != 0 {
            self.report.special_bits_cleared += 1;
        }
        if header.uid().unwrap_or(0) != 0 || header.gid().unwrap_or(0) != 0 {
            self.report.ownership_reset += 1;
        }
        let mut full = self.prefix.clone();
        full.extend(parts.iter().copied());
        Ok(Member {
            shown,
            relative: join(parts),
            name: join(&full),
            mode: raw_mode & 0o777,
            mtime: header.mtime().unwrap_or(0),
        })
    }

    fn write(
        &mut self,
        member: &Member,
        f: impl FnOnce(&mut Builder<W>) -> io::Result<()>,
    ) -> Result<(), TarsafeError> {
        f(&mut self.out).map_err(|e| io_err(&format!("writing {:?}", member.shown), e))
    }

    fn symlink<R: Read>(
        &mut self,
        entry: &Entry<'_, R>,
        member: &Member,
    ) -> Result<(), TarsafeError> {
        let target = entry
            .link_name_bytes()
            .map(|t| t.into_owned())
            .ok_or_else(|| {
                TarsafeError(format!("archive symlink {:?} has no target", member.shown))
            })?;
        if target.is_empty() || target.contains(&0) {
            return Err(TarsafeError(format!(
                "archive symlink {:?} has an empty or invalid target",
                member.shown
            )));
        }
        let mut h = fresh_header(EntryType::Symlink, 0o777, member.mtime, 0);
        self.write(member, |out| {
            out.append_link(&mut h, as_path(&member.name), as_path(&target))
        })?;
        self.symlinks.insert(member.relative.clone());
        self.files.remove(&member.relative);
        Ok(())
    }

    /// Hard-link targets are archive members: they move with the prefix, and must be a file
    /// this archive wrote earlier (so they can neither leave the archive nor pass through one
    /// of its symlinks).
    fn hard_link<R: Read>(
        &mut self,
        entry: &Entry<'_, R>,
        member: &Member,
    ) -> Result<(), TarsafeError> {
        let target = entry
            .link_name_bytes()
            .map(|t| t.into_owned())
            .ok_or_else(|| {
                TarsafeError(format!(
                    "archive hard link {:?} has no target",
                    member.shown
                ))
            })?;
        let target_parts = components("hard link target", &target)?;
        if target_parts.is_empty() {
            return Err(TarsafeError(format!(
                "archive hard link {:?} points at the destination directory itself",
                member.shown
            )));
        }
        self.not_through_symlink("hard link target", &target_parts)?;
        if !self.files.contains(&join(&target_parts)) {
            return Err(TarsafeError(format!(
                "archive hard link {:?} points at {:?}, which is not a file written earlier in the \
                 same archive; a hard link may only join files of the archive",
                member.shown,
                String::from_utf8_lossy(&target)
            )));
        }
        let mut full = self.prefix.clone();
        full.extend(target_parts.iter().copied());
        let mut h = fresh_header(EntryType::Link, member.mode, member.mtime, 0);
        self.write(member, |out| {
            out.append_link(&mut h, as_path(&member.name), as_path(&join(&full)))
        })?;
        self.symlinks.remove(&member.relative);
        self.files.insert(member.relative.clone());
        Ok(())
    }

    /// Refuses a path that goes through a symlink created earlier in this archive.
    fn not_through_symlink(&self, what: &str, parts: &[&[u8]]) -> Result<(), TarsafeError> {
        for depth in 1..parts.len() {
            let ancestor = join(&parts[..depth]);
            if self.symlinks.contains(&ancestor) {
                return Err(TarsafeError(format!(
                    "archive {what} {:?} passes through {:?}, a symlink created earlier in the same \
                     archive; writing through a symlink is refused",
                    String::from_utf8_lossy(&join(parts)),
                    String::from_utf8_lossy(&ancestor)
                )));
            }
        }
        Ok(())
    }
}

/// PAX sparse files would be written out as their raw sparse map: refuse rather than
/// corrupt. (GNU old-style sparse entries are expanded by the reader.)
fn refuse_pax_sparse<R: Read>(entry: &mut Entry<'_, R>, shown: &str) -> Result<(), TarsafeError> {
    let Some(pax) = entry
        .pax_extensions()
        .map_err(|e| io_err("reading pax records", e))?
    else {
        return Ok(());
    };
    for record in pax {
        let record = record.map_err(|e| io_err("reading a pax record", e))?;
        if record.key_bytes().starts_with(b"GNU.sparse.") {
            return Err(TarsafeError(format!(
                "archive member {shown:?} uses the PAX sparse format, which is not supported; \
                 archive it without --sparse"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a raw header with an arbitrary (possibly hostile) name, bypassing the tar
    /// crate's own refusal to write `..` or absolute names.
    fn raw_entry(
        out: &mut Vec<u8>,
        name: &[u8],
        kind: EntryType,
        link: &[u8],
        mode: u32,
        data: &[u8],
    ) {
        let mut h = Header::new_old();
        {
            let old = h.as_old_mut();
            old.name[..name.len()].copy_from_slice(name);
            old.linkname[..link.len()].copy_from_slice(link);
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(1234);
        h.set_gid(1234);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        out.extend(std::iter::repeat_n(0u8, pad));
    }

    fn finish(mut out: Vec<u8>) -> Vec<u8> {
        out.extend(std::iter::repeat_n(0u8, 1024));
        out
    }

    struct Seen {
        name: String,
        kind: EntryType,
        mode: u32,
        uid: u64,
        gid: u64,
        link: Option<String>,
        data: Vec<u8>,
        pax: bool,
    }

    fn read_back(archive: &[u8]) -> Vec<Seen> {
        let mut ar = Archive::new(archive);
        ar.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let pax = e.pax_extensions().unwrap().is_some();
                let h = e.header().clone();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                Seen {
                    name: String::from_utf8(e.path_bytes().into_owned()).unwrap(),
                    kind: h.entry_type(),
                    mode: h.mode().unwrap(),
                    uid: h.uid().unwrap(),
                    gid: h.gid().unwrap(),
                    link: e
                        .link_name_bytes()
                        .map(|l| String::from_utf8(l.into_owned()).unwrap()),
                    data,
                    pax,
                }
            })
            .collect()
    }

    #[test]
    fn parent_traversal_is_refused() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"ok.txt", EntryType::Regular, b"", 0o644, b"fine");
        raw_entry(&mut a, b"../x", EntryType::Regular, b"", 0o644, b"evil");
        let a = finish(a);
        let err = sanitise(&a, "").unwrap_err();
        assert!(err.0.contains("'..'"), "{err}");
        // The same rules for an archive read as it arrives.
        let err = sanitise_pieces(arriving(&a, 100).into_iter(), "").unwrap_err();
        assert!(err.0.contains("'..'"), "{err}");
        let mut a = Vec::new();
        raw_entry(
            &mut a,
            b"a/b/../../../x",
            EntryType::Regular,
            b"",
            0o644,
            b"evil",
        );
        assert!(sanitise(&finish(a), "").is_err());
    }

    #[test]
    fn absolute_names_are_refused() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"/etc/x", EntryType::Regular, b"", 0o644, b"evil");
        let err = sanitise(&finish(a), "").unwrap_err();
        assert!(err.0.contains("absolute"), "{err}");
    }

    #[test]
    fn hard_links_out_of_the_archive_are_refused() {
        for target in [&b"/etc/shadow"[..], b"../../etc/shadow", b"a/../../x"] {
            let mut a = Vec::new();
            raw_entry(&mut a, b"shadow", EntryType::Link, target, 0o644, b"");
            let err = sanitise(&finish(a), "").unwrap_err();
            assert!(err.0.contains("hard link target"), "{err}");
        }
        // A relative name the archive never wrote would link to the destination's own file.
        let mut a = Vec::new();
        raw_entry(&mut a, b"pw", EntryType::Link, b"etc/passwd", 0o644, b"");
        let err = sanitise(&finish(a), "").unwrap_err();
        assert!(err.0.contains("not a file written earlier"), "{err}");
    }

    #[test]
    fn hard_links_inside_the_archive_are_kept_and_prefixed() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"app/f", EntryType::Regular, b"", 0o644, b"x");
        raw_entry(&mut a, b"app/g", EntryType::Link, b"app/f", 0o644, b"");
        let out = sanitise(&finish(a), "dest").unwrap();
        let seen = read_back(&out.archive);
        let g = seen.iter().find(|s| s.name == "dest/app/g").unwrap();
        assert_eq!(g.kind, EntryType::Link);
        assert_eq!(g.link.as_deref(), Some("dest/app/f"));
    }

    #[test]
    fn setuid_setgid_sticky_and_ownership_never_survive() {
        let mut a = Vec::new();
        raw_entry(
            &mut a,
            b"bin/su",
            EntryType::Regular,
            b"",
            0o4755,
            b"#!/bin/sh\n",
        );
        raw_entry(&mut a, b"bin/sg", EntryType::Regular, b"", 0o2711, b"x");
        raw_entry(&mut a, b"shared/", EntryType::Directory, b"", 0o3777, b"");
        let out = sanitise(&finish(a), "").unwrap();
        assert_eq!(out.report.special_bits_cleared, 3);
        assert_eq!(out.report.ownership_reset, 3);
        let seen = read_back(&out.archive);
        assert_eq!(seen.len(), 3);
        for s in &seen {
            assert_eq!(
                s.mode & 0o7000,
                0,
                "{} kept special bits: {:o}",
                s.name,
                s.mode
            );
            assert_eq!((s.uid, s.gid), (0, 0), "{} kept its owner", s.name);
        }
        assert_eq!(seen[0].mode, 0o755);
        assert_eq!(seen[0].data, b"#!/bin/sh\n");
        assert_eq!(seen[1].mode, 0o711);
        assert_eq!(seen[2].mode, 0o777);
    }

    #[test]
    fn writing_through_a_symlink_from_the_same_archive_is_refused() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"link", EntryType::Symlink, b"/etc", 0o777, b"");
        raw_entry(
            &mut a,
            b"link/passwd",
            EntryType::Regular,
            b"",
            0o644,
            b"root::0:0::/:/bin/sh\n",
        );
        let err = sanitise(&finish(a), "").unwrap_err();
        assert!(err.0.contains("symlink"), "{err}");

        // The same through a deeper path and through a hard link's target.
        let mut a = Vec::new();
        raw_entry(&mut a, b"d/l", EntryType::Symlink, b"../../..", 0o777, b"");
        raw_entry(&mut a, b"d/l/x/y", EntryType::Regular, b"", 0o644, b"");
        assert!(sanitise(&finish(a), "").is_err());
        let mut a = Vec::new();
        raw_entry(&mut a, b"l", EntryType::Symlink, b"/etc", 0o777, b"");
        raw_entry(&mut a, b"h", EntryType::Link, b"l/shadow", 0o644, b"");
        assert!(sanitise(&finish(a), "").is_err());
    }

    #[test]
    fn plain_symlinks_are_kept_and_a_replaced_symlink_no_longer_blocks() {
        let mut a = Vec::new();
        raw_entry(
            &mut a,
            b"current",
            EntryType::Symlink,
            b"releases/v1",
            0o777,
            b"",
        );
        raw_entry(
            &mut a,
            b"abs",
            EntryType::Symlink,
            b"/usr/bin/env",
            0o777,
            b"",
        );
        raw_entry(&mut a, b"current", EntryType::Directory, b"", 0o755, b"");
        raw_entry(
            &mut a,
            b"current/file",
            EntryType::Regular,
            b"",
            0o644,
            b"ok",
        );
        let seen = read_back(&sanitise(&finish(a), "").unwrap().archive);
        assert_eq!(seen[0].link.as_deref(), Some("releases/v1"));
        assert_eq!(seen[1].link.as_deref(), Some("/usr/bin/env"));
        assert_eq!(seen[3].name, "current/file");
    }

    #[test]
    fn devices_fifos_and_the_dot_entry_are_dropped() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"./", EntryType::Directory, b"", 0o700, b"");
        raw_entry(&mut a, b"./dev/sda", EntryType::Block, b"", 0o666, b"");
        raw_entry(&mut a, b"./dev/null", EntryType::Char, b"", 0o666, b"");
        raw_entry(&mut a, b"./pipe", EntryType::Fifo, b"", 0o666, b"");
        raw_entry(&mut a, b"./keep.txt", EntryType::Regular, b"", 0o600, b"k");
        let out = sanitise(&finish(a), "").unwrap();
        assert_eq!(out.report.dropped.len(), 4, "{:?}", out.report.dropped);
        let seen = read_back(&out.archive);
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].name, "keep.txt");
        assert_eq!(seen[0].mode, 0o600);
    }

    #[test]
    fn pax_records_such_as_file_capabilities_are_not_carried() {
        let mut b = Builder::new(Vec::new());
        b.append_pax_extensions([
            (
                "SCHILY.xattr.security.capability",
                &b"\x01\x00\x00\x02\xff\xff\xff\xff"[..],
            ),
            ("path", &b"very/long/name/from/pax.bin"[..]),
        ])
        .unwrap();
        let mut h = Header::new_ustar();
        h.set_path("short").unwrap();
        h.set_mode(0o755);
        h.set_size(3);
        h.set_cksum();
        b.append(&h, &b"abc"[..]).unwrap();
        let out = sanitise(&b.into_inner().unwrap(), "").unwrap();
        let seen = read_back(&out.archive);
        assert_eq!(seen.len(), 1);
        assert_eq!(
            seen[0].name, "very/long/name/from/pax.bin",
            "pax path is honoured"
        );
        assert!(!seen[0].pax, "pax records must not be copied");
        assert_eq!(seen[0].data, b"abc");
    }

    #[test]
    fn long_names_and_targets_survive_and_prefix_dirs_come_first() {
        let long = format!("{}/file.txt", "d".repeat(150));
        let target = format!("/{}", "t".repeat(200));
        let mut b = Builder::new(Vec::new());
        let mut h = Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        b.append_data(&mut h, &long, &b"hi"[..]).unwrap();
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(&mut h, "ln", &target).unwrap();
        let out = sanitise(&b.into_inner().unwrap(), "a/b").unwrap();
        let seen = read_back(&out.archive);
        let names: Vec<&str> = seen.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names[..2], ["a", "a/b"]);
        assert_eq!(seen[0].kind, EntryType::Directory);
        assert_eq!(seen[0].mode, 0o755);
        assert_eq!(names[2], format!("a/b/{long}"));
        assert_eq!(seen[3].link.as_deref(), Some(target.as_str()));
        assert_eq!(out.report.entries, 4);
    }

    #[test]
    fn garbage_is_an_error_not_an_empty_import() {
        assert!(sanitise(&[7u8; 700], "").is_err());
        assert!(sanitise(b"x", "../up").is_err());
    }

    #[test]
    fn only_the_missing_prefix_directories_are_emitted() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"app/f", EntryType::Regular, b"", 0o644, b"x");
        let mut out = Vec::new();
        let placement = Placement {
            prefix: "data/deep/er",
            create_dirs: 2,
        };
        let report = sanitise_into(&finish(a.clone())[..], &mut out, placement).unwrap();
        let names: Vec<String> = read_back(&out).into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["data/deep", "data/deep/er", "data/deep/er/app/f"]);
        assert_eq!(report.entries, 3);
        let mut out = Vec::new();
        let none = Placement {
            prefix: "data",
            create_dirs: 0,
        };
        sanitise_into(&finish(a)[..], &mut out, none).unwrap();
        let names: Vec<String> = read_back(&out).into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["data/app/f"]);
    }

    #[test]
    fn an_archive_that_ends_inside_a_file_is_refused() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"big", EntryType::Regular, b"", 0o644, &[7u8; 4096]);
        a.truncate(512 + 1000);
        let err = sanitise(&a, "").unwrap_err();
        assert!(err.0.contains("big") || err.0.contains("ends"), "{err}");
    }

    #[test]
    fn unknown_entry_types_are_refused_not_dropped() {
        let mut a = Vec::new();
        raw_entry(&mut a, b"odd", EntryType::new(b'Z'), b"", 0o644, b"");
        let err = sanitise(&finish(a), "").unwrap_err();
        assert!(err.0.contains("unsupported entry type"), "{err}");
    }

    #[test]
    fn large_files_stream_through_unchanged() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut a = Vec::new();
        raw_entry(&mut a, b"blob", EntryType::Regular, b"", 0o640, &data);
        let out = sanitise(&finish(a), "").unwrap();
        let seen = read_back(&out.archive);
        assert_eq!(seen[0].data, data);
        assert_eq!(seen[0].mode, 0o640);
    }

    /// The hostile archives of the template restore tests (tests/template_restore.rs), each
    /// refused or neutralised by this sanitiser too. It knows nothing of capture paths (that
    /// confinement is the restore's own), so a member outside them passes here.
    #[test]
    fn the_restore_tests_hostile_archives_are_refused_or_neutralised() {
        use EntryType as E;
        type Case = (
            &'static str,
            Vec<(&'static [u8], E, &'static [u8], u32)>,
            bool,
        );
        let cases: Vec<Case> = vec![
            (
                "..",
                vec![(b"workspace/app/../../etc/evil", E::Regular, b"", 0o644)],
                false,
            ),
            (
                "absolute",
                vec![(b"/etc/evil", E::Regular, b"", 0o644)],
                false,
            ),
            (
                "through an absolute symlink",
                vec![
                    (b"workspace/app/lnk", E::Symlink, b"/etc", 0o777),
                    (b"workspace/app/lnk/evil", E::Regular, b"", 0o644),
                ],
                false,
            ),
            (
                "through a relative symlink",
                vec![
                    (b"workspace/app/lnk", E::Symlink, b"../../tmp", 0o777),
                    (b"workspace/app/lnk/escaped", E::Regular, b"", 0o644),
                ],
                false,
            ),
            (
                "two levels through a symlink to /",
                vec![
                    (b"workspace/app/root", E::Symlink, b"/", 0o777),
                    (b"workspace/app/root/tmp/escaped", E::Regular, b"", 0o644),
                ],
                false,
            ),
            (
                "hard link to etc/passwd",
                vec![(b"workspace/app/pw", E::Link, b"etc/passwd", 0o644)],
                false,
            ),
            (
                "hard link to /etc/shadow",
                vec![(b"workspace/app/sh", E::Link, b"/etc/shadow", 0o644)],
                false,
            ),
            (
                "hard link through a symlink",
                vec![
                    (b"workspace/app/lnk", E::Symlink, b"/etc", 0o777),
                    (
                        b"workspace/app/pw",
                        E::Link,
                        b"workspace/app/lnk/passwd",
                        0o644,
                    ),
                ],
                false,
            ),
            (
                "setuid, setgid, sticky",
                vec![
                    (b"workspace/app/su", E::Regular, b"", 0o4755),
                    (b"workspace/app/sg", E::Regular, b"", 0o2755),
                    (b"workspace/app/sgdir/", E::Directory, b"", 0o3775),
                ],
                true,
            ),
            (
                "device node",
                vec![(b"workspace/app/mem", E::Char, b"", 0o666)],
                true,
            ),
        ];
        for (what, members, passes) in cases {
            let mut a = Vec::new();
            raw_entry(
                &mut a,
                b"workspace/app/ok.txt",
                E::Regular,
                b"",
                0o644,
                b"ok",
            );
            for (name, kind, link, mode) in members {
                raw_entry(&mut a, name, kind, link, mode, b"");
            }
            match (sanitise(&finish(a), ""), passes) {
                (Err(_), false) => {}
                (Ok(out), true) => {
                    for s in read_back(&out.archive) {
                        assert_eq!(s.mode & 0o7000, 0, "{what}: {} kept {:o}", s.name, s.mode);
                        assert!(
                            matches!(s.kind, E::Regular | E::Directory),
                            "{what}: {} is {:?}",
                            s.name,
                            s.kind
                        );
                    }
                }
                (other, _) => panic!("{what}: {other:?}"),
            }
        }
    }

    /// An archive with every kind of member the rewrite keeps, files of sizes around the
    /// block size, a long name and a large file.
    fn mixed_archive() -> Vec<u8> {
        let mut b = Builder::new(Vec::new());
        let mut add = |name: &str, data: &[u8]| {
            let mut h = Header::new_gnu();
            h.set_mode(0o4755);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, name, data).unwrap();
        };
        let large: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        add("d/empty", b"");
        add("d/one", b"1");
        add("d/block", &[7u8; 512]);
        add("d/over", &[8u8; 513]);
        add(&format!("d/{}/long", "n".repeat(120)), b"long name");
        add("d/large", &large);
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Link);
        h.set_size(0);
        h.set_mode(0o644);
        b.append_link(&mut h, "d/again", "d/one").unwrap();
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o644);
        b.append_link(&mut h, "d/link", "one").unwrap();
        b.into_inner().unwrap()
    }

    /// `archive` as it would arrive: pieces of `size` bytes (the last one shorter).
    fn arriving(archive: &[u8], size: usize) -> Vec<io::Result<Bytes>> {
        let whole = Bytes::copy_from_slice(archive);
        (0..archive.len())
            .step_by(size)
            .map(|at| Ok(whole.slice(at..archive.len().min(at + size))))
            .collect()
    }

    #[test]
    fn an_arriving_archive_is_rewritten_as_the_whole_one_is_however_it_is_split() {
        let archive = mixed_archive();
        let whole = sanitise(&archive, "under/here").unwrap();
        for size in [1, 7, 511, 512, 4096, 65_536, archive.len()] {
            let pieces = sanitise_pieces(arriving(&archive, size).into_iter(), "under/here")
                .unwrap_or_else(|e| panic!("pieces of {size}: {e}"));
            assert!(pieces.to_vec() == whole.archive, "pieces of {size} differ");
            assert_eq!(pieces.report, whole.report, "pieces of {size}");
        }
        let seen = read_back(&whole.archive);
        let large = seen
            .iter()
            .find(|s| s.name == "under/here/d/large")
            .unwrap();
        assert_eq!(large.data.len(), 300_000);
        assert_eq!(large.mode, 0o755, "setuid cleared on the way");
    }

    #[test]
    fn kept_file_data_is_a_slice_of_what_arrived() {
        let archive = mixed_archive();
        let input = arriving(&archive, 65_536);
        let arrived: Vec<(usize, usize)> = input
            .iter()
            .map(|p| p.as_ref().map(|b| (b.as_ptr() as usize, b.len())).unwrap())
            .collect();
        let within = |p: &Bytes| {
            let at = p.as_ptr() as usize;
            arrived
                .iter()
                .any(|(start, len)| at >= *start && at < start + len)
        };
        let pieces = sanitise_pieces(input.into_iter(), "").unwrap();
        let kept: usize = pieces
            .pieces
            .iter()
            .filter(|p| within(p))
            .map(Bytes::len)
            .sum();
        assert!(
            kept >= 300_000,
            "the large file's data was copied: only {kept} bytes are slices of the input"
        );
    }

    #[test]
    fn an_arriving_archive_that_ends_inside_a_file_or_breaks_is_refused() {
        let archive = mixed_archive();
        let whole = sanitise(&archive, "").unwrap();
        let large = read_back(&whole.archive);
        assert!(large.iter().any(|s| s.data.len() == 300_000));
        // Cuts inside the large file's data (most of the archive).
        for cut in [archive.len() / 3, archive.len() / 2 + 1] {
            let short = &archive[..cut];
            for size in [512, 4096] {
                let got = sanitise_pieces(arriving(short, size).into_iter(), "");
                assert!(got.is_err(), "cut at {cut}, pieces of {size}: accepted");
            }
            assert!(
                sanitise(short, "").is_err(),
                "cut at {cut}: the whole one accepted"
            );
        }
        let mut broken = arriving(&archive, 4096);
        broken.truncate(40);
        broken.push(Err(io::Error::new(io::ErrorKind::ConnectionReset, "gone")));
        let err = sanitise_pieces(broken.into_iter(), "").unwrap_err();
        assert!(err.0.contains("gone"), "{err}");
    }
}
