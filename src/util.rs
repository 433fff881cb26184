//! Small helpers shared by several modules.

#[cfg(not(target_os = "linux"))]
use std::io::Read;

use sha2::{Digest, Sha256};

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let [hi, lo] = hex_pair(*b);
        out.push(hi as char);
        out.push(lo as char);
    }
    out
}

/// A 32-byte digest's 64 lower-case hex digits, on the stack (for text written at once).
pub fn hex32(bytes: &[u8; 32]) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (pair, b) in out.as_chunks_mut::<2>().0.iter_mut().zip(bytes) {
        *pair = hex_pair(*b);
    }
    out
}

fn hex_pair(b: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [DIGITS[(b >> 4) as usize], DIGITS[(b & 0x0f) as usize]]
}

/// Value of each lower-case hex digit; 0xff for every other byte.
const UNHEX: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// The 32 bytes spelled by 64 lower-case hex digits; None for anything else. Table-driven
/// and branch-free per digit: every journal record's `prev` goes through here on replay.
pub fn unhex32(text: &str) -> Option<[u8; 32]> {
    let bytes: &[u8; 64] = text.as_bytes().try_into().ok()?;
    let mut out = [0u8; 32];
    let mut bad = 0u8;
    for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let (hi, lo) = (UNHEX[pair[0] as usize], UNHEX[pair[1] as usize]);
        bad |= hi | lo;
        *o = (hi << 4) | (lo & 0x0f);
    }
    // Valid digits are below 16; 0xff from any invalid byte sets the high bits.
    (bad < 16).then_some(out)
}

/// Hex sha256 of `bytes`.
/// How deeply the containers of a JSON text nest (0 for a scalar), brackets inside strings
/// not counted. For text this process wrote, before anything relies on reading it back:
/// serde_json refuses to parse more than 127 levels and writes any depth.
pub fn json_depth(text: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in text {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Whether the containers of a JSON text nest deeper than `limit` ([`json_depth`]). Nesting
/// needs an opening bracket per level, so a text with at most `limit` of them (most records:
/// a handful) is answered by counting, which vectorizes, without following strings.
pub fn json_deeper_than(text: &[u8], limit: usize) -> bool {
    // Summed as bytes, 255 at a time so no sum overflows: `filter().count()` widens every
    // byte to a `usize` first, a ninth of the speed (0.9 against 0.1 µs over 2.3 KB).
    let opening: usize = text
        .chunks(255)
        .map(|chunk| {
            chunk
                .iter()
                .map(|&b| u8::from(b == b'[') + u8::from(b == b'{'))
                .sum::<u8>() as usize
        })
        .sum();
    opening > limit && json_depth(text) > limit
}

/// Largest configuration file (policy, providers, roster) gaffer reads.
pub const CONFIG_FILE_LIMIT: u64 = 4 << 20;
/// Largest snapshot or blob gaffer reads (a snapshot of a million operations is a few hundred
/// MiB); a bigger one is refused by its size, before anything is read.
pub const STORE_FILE_LIMIT: u64 = 4 << 30;

/// Reads a file the agent may have planted something else at (anything under the workspace):
/// a FIFO must not block the reading thread, and a device or an oversized file must not
/// exhaust memory. The file is opened without waiting (`O_NONBLOCK`) and read only if it is
/// a regular file of at most `limit` bytes (checked on the descriptor read, so no swap between
/// a look and the read gets past it). Symbolic links are followed, as an operator may link a
/// shared file. `NotFound` passes through for callers that treat absence as a default.
pub fn read_regular_file(path: &std::path::Path, limit: Option<u64>) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    let too_large = |size: u64, limit: u64| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} is {size} bytes, over the {limit}-byte limit",
                path.display()
            ),
        )
    };
    let limit = limit.unwrap_or(u64::MAX);
    if meta.len() > limit {
        return Err(too_large(meta.len(), limit));
    }
    // A sparse file may claim any size: reserve no more than a modest start.
    let mut bytes = Vec::with_capacity(meta.len().min(1 << 24) as usize);
    // The file may grow after the look: never read past the limit.
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64, limit));
    }
    Ok(bytes)
}

/// Whether a terminal would obey `c` or show nothing for it: every control character (C0,
/// DEL, C1: U+009B alone is a CSI on xterm), every format character (Unicode 16 `Cf`: bidi
/// marks, overrides and isolates, zero-width, soft hyphen, Arabic and Syriac marks, BOM,
/// interlinear annotations, Egyptian and shorthand format controls, tags), line and paragraph
/// separators, and the default-ignorable code points (variation selectors, combining grapheme
/// joiner, Hangul fillers, Khmer inherent vowels, Mongolian selectors, U+FFF0-FFF8, the
/// E0000 plane block) plus the braille blank, which render as nothing or as blank space.
/// Text the agent chose must not move the cursor, erase or pad away what is printed, or
/// reorder what is read; `unicode_sets_are_hidden` holds this table to the Unicode data.
pub fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c as u32,
            0xad | 0x34f
                | 0x600..=0x605
                | 0x61c
                | 0x6dd
                | 0x70f
                | 0x890..=0x891
                | 0x8e2
                | 0x115f..=0x1160
                | 0x17b4..=0x17b5
                | 0x180b..=0x180f
                | 0x200b..=0x200f
                | 0x2028..=0x202e
                | 0x2060..=0x206f
                | 0x2800
                | 0x3164
                | 0xfe00..=0xfe0f
                | 0xfeff
                | 0xffa0
                | 0xfff0..=0xfffb
                | 0x110bd
                | 0x110cd
                | 0x13430..=0x1343f
                | 0x1bca0..=0x1bca3
                | 0x1d173..=0x1d17a
                | 0xe0000..=0xe0fff
        )
}

/// `s` as a terminal shows it without obeying it: every [`hidden`] character written as
/// `\u{…}`, so text the agent chose can neither move the cursor, erase what was printed,
/// write the clipboard, nor hide, pad away or reorder what is read.
pub fn visible(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if hidden(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `n` bytes from the OS random source: for long-lived secrets (key seeds) and for seeding
/// [`random_bytes`]' generator. `getrandom(2)` on Linux (one system call, no descriptor;
/// it waits only until the kernel's pool is first seeded at boot), `/dev/urandom` elsewhere.
pub fn os_random_bytes(n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    #[cfg(target_os = "linux")]
    {
        let mut filled = 0;
        while filled < n {
            let rest = &mut buf[filled..];
            // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`.
            let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
            if got < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            filled += got as usize;
        }
    }
    #[cfg(not(target_os = "linux"))]
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf)
}

/// SHA-256 in counter mode under a secret key seeded once from the OS: a CSPRNG whose output
/// is a PRF of a key nobody outside this process has seen. Rekeyed after every request, so
/// bytes already handed out cannot be recomputed from the state later (forward secrecy).
struct Generator {
    key: [u8; 32],
    counter: u64,
}

impl Generator {
    fn block(&mut self, domain: u8) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update([domain]);
        h.update(self.key);
        h.update(self.counter.to_le_bytes());
        self.counter = self.counter.wrapping_add(1);
        h.finalize().into()
    }

    fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(32) {
            let block = self.block(0);
            chunk.copy_from_slice(&block[..chunk.len()]);
        }
        self.key = self.block(1);
    }
}

static GENERATOR: std::sync::Mutex<Option<Generator>> = std::sync::Mutex::new(None);

/// `n` random bytes for ids and nonces, from a generator seeded once from the OS: a file
/// open per id was most of an id's cost on the submit path.
pub fn random_bytes(n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    fill_random(&mut buf)?;
    Ok(buf)
}

/// Fills `out` from the generator [`random_bytes`] uses.
fn fill_random(out: &mut [u8]) -> std::io::Result<()> {
    let mut g = GENERATOR.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        let key: [u8; 32] = os_random_bytes(32)?
            .try_into()
            .map_err(|_| std::io::Error::other("short read from the OS random source"))?;
        *g = Some(Generator { key, counter: 0 });
    }
    if let Some(generator) = g.as_mut() {
        generator.fill(out);
    }
    Ok(())
}

/// A fresh random id: `prefix` + base64url of 18 random bytes (144 bits).
pub fn new_id(prefix: &str) -> std::io::Result<String> {
    let mut bytes = [0u8; 18];
    fill_random(&mut bytes)?;
    let mut id = String::with_capacity(prefix.len() + 24);
    id.push_str(prefix);
    push_base64url(&bytes, &mut id);
    Ok(id)
}

/// Whether `s` is an id [`new_id`] makes with `prefix`: the prefix, then 24 base64url
/// characters (18 random bytes), nothing else.
pub fn is_id(prefix: &str, s: &str) -> bool {
    s.strip_prefix(prefix)
        .is_some_and(|rest| rest.len() == 24 && rest.bytes().all(|b| B64URL.contains(&b)))
}

const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Unpadded base64url (RFC 4648 §5).
pub fn base64url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    push_base64url(bytes, &mut out);
    out
}

/// [`base64url`], appended to `out`.
fn push_base64url(bytes: &[u8], out: &mut String) {
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = ((b[0] as u32) << 16) | ((b[1] as u32) << 8) | b[2] as u32;
        for i in 0..=chunk.len() {
            out.push(B64URL[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
}

/// Decodes unpadded base64url; `None` on any other character, padding or a stray length.
pub fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let sextet = |c: u8| B64URL.iter().position(|&a| a == c).map(|p| p as u32);
    let bytes = text.as_bytes();
    if bytes.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= sextet(c)? << (18 - 6 * i);
        }
        let full = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&full[..chunk.len() - 1]);
    }
    // Canonical only: re-encoding must give the same text (no stray low bits).
    (base64url(&out) == text).then_some(out)
}

/// Starts `f` on a thread of `scope` named `name`; None when the system refuses a thread,
/// which is no error: the caller then does the work itself.
pub fn spawn_scoped<'scope, T: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    name: &str,
    f: impl FnOnce() -> T + Send + 'scope,
) -> Option<std::thread::ScopedJoinHandle<'scope, T>> {
    match std::thread::Builder::new()
        .name(name.into())
        .spawn_scoped(scope, f)
    {
        Ok(handle) => Some(handle),
        Err(e) => {
            tracing::debug!(error = %e, thread = name, "no thread to be had; working on the caller's");
            None
        }
    }
}

/// What a scoped thread returned; if it panicked, the panic goes on in this thread.
pub fn join_scoped<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Deserializes a map by collecting its entries first and building the tree in bulk: full
/// nodes, where inserting one entry at a time (serde's way) leaves sorted input's nodes about
/// half full. For large maps decoded from snapshots. A repeated key keeps its last value, as
/// insertion would.
pub fn bulk_map<'de, D, K, V>(d: D) -> Result<std::collections::BTreeMap<K, V>, D::Error>
where
    D: serde::Deserializer<'de>,
    K: serde::Deserialize<'de> + Ord,
    V: serde::Deserialize<'de>,
{
    struct Entries<K, V>(std::marker::PhantomData<(K, V)>);
    impl<'de, K: serde::Deserialize<'de>, V: serde::Deserialize<'de>> serde::de::Visitor<'de>
        for Entries<K, V>
    {
        type Value = Vec<(K, V)>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut m: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(m.size_hint().unwrap_or(0).min(4096));
            while let Some(entry) = m.next_entry()? {
                out.push(entry);
            }
            Ok(out)
        }
    }
    let entries = d.deserialize_map(Entries(std::marker::PhantomData))?;
    Ok(entries.into_iter().collect())
}

/// `openat2(dirfd, path, flags, resolve)` (Linux): the path resolved as `resolve` says, e.g.
/// never through a symbolic link (`RESOLVE_NO_SYMLINKS`) or out of `dirfd`
/// (`RESOLVE_BENEATH`).
#[cfg(target_os = "linux")]
pub fn openat2(
    dirfd: std::os::fd::RawFd,
    path: &std::path::Path,
    flags: i32,
    resolve: u64,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; zeroed is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = u64::from(flags as u32);
    how.resolve = resolve;
    // SAFETY: a NUL-terminated path and a live open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor, owned by nothing else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A granted path is opened without following a link anywhere on it (what a grant reaches
    /// cannot be redirected between resolving and opening it).
    #[test]
    fn openat2_without_symlinks_refuses_a_path_through_a_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        std::os::unix::fs::symlink(&real, dir.path().join("link")).expect("symlink");
        let open = |p: &std::path::Path| {
            openat2(
                libc::AT_FDCWD,
                p,
                libc::O_PATH | libc::O_CLOEXEC,
                libc::RESOLVE_NO_SYMLINKS,
            )
        };
        let real = std::fs::canonicalize(&real).expect("canonical");
        assert!(open(&real).is_ok());
        let through = std::fs::canonicalize(dir.path())
            .expect("canonical")
            .join("link");
        let e = open(&through).expect_err("through a link");
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
    }

    #[test]
    fn is_id_accepts_what_new_id_makes_and_nothing_that_aliases_it() {
        let id = new_id("op_").unwrap();
        assert!(is_id("op_", &id));
        let bare = &id[3..];
        for alias in [
            bare.to_string(),
            format!("op_{id}"),
            format!("{id}x"),
            id[..26].into(),
        ] {
            assert!(!is_id("op_", &alias), "{alias}");
        }
        assert!(!is_id("op_", "op_AAAAAAAAAAAAAAAAAAAAAA/+"));
    }

    #[test]
    fn read_regular_file_refuses_what_could_block_or_flood_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let err = read_regular_file(&fifo, None).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(read_regular_file(&zero, None).is_err());
        let big = dir.path().join("big");
        std::fs::write(&big, [b'x'; 11]).unwrap();
        let err = read_regular_file(&big, Some(10)).unwrap_err();
        assert!(err.to_string().contains("over the 10-byte limit"), "{err}");
        assert_eq!(read_regular_file(&big, Some(11)).unwrap(), [b'x'; 11]);
        let linked = dir.path().join("linked");
        std::os::unix::fs::symlink(&big, &linked).unwrap();
        assert_eq!(read_regular_file(&linked, None).unwrap().len(), 11);
        // A sparse file claiming a terabyte is refused by its size, with nothing reserved.
        let sparse = dir.path().join("sparse");
        std::fs::File::create(&sparse)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let err = read_regular_file(&sparse, Some(STORE_FILE_LIMIT)).unwrap_err();
        assert!(err.to_string().contains("over the"), "{err}");
        let missing = read_regular_file(&dir.path().join("none"), None).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn json_depth_counts_containers_and_skips_strings() {
        assert_eq!(json_depth(b"1"), 0);
        assert_eq!(json_depth(br#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(json_depth(br#"["[[[\"{{", {}]"#), 2);
        let deep: serde_json::Value =
            (0..200).fold(serde_json::json!(0), |v, _| serde_json::json!([v]));
        assert_eq!(
            json_depth(serde_json::to_string(&deep).unwrap().as_bytes()),
            200
        );
    }

    #[test]
    fn deeper_than_agrees_with_the_depth_on_either_side_of_the_bound() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        // Past 255 levels a lane of the count is full.
        for n in [0, 1, 99, 100, 101, 200, 255, 256, 300] {
            for limit in [0, 1, 100, 254, 255, 299] {
                assert_eq!(json_deeper_than(nested(n).as_bytes(), limit), n > limit);
            }
        }
        // Brackets in strings count toward the bound but not the depth.
        let flat = format!(r#"{{"a":"{}"}}"#, "[".repeat(300));
        assert!(!json_deeper_than(flat.as_bytes(), 100));
        let wide = format!("[{}]", vec!["{}"; 300].join(","));
        assert!(!json_deeper_than(wide.as_bytes(), 100));
    }

    proptest::proptest! {
        /// The counting shortcut never changes the answer, over texts dense in brackets,
        /// quotes and escapes (not all of them JSON: the bound holds for any bytes).
        #[test]
        fn deeper_than_is_the_depth_compared(text in r#"[\[\]{}"\\a]{0,24}"#, limit in 0usize..6) {
            proptest::prop_assert_eq!(
                json_deeper_than(text.as_bytes(), limit),
                json_depth(text.as_bytes()) > limit
            );
        }

        /// The same over texts longer than the 255-byte lanes the count adds up.
        #[test]
        fn deeper_than_is_the_depth_compared_past_a_lane(
            text in r#"[\[\]{}"\\a]{200,1200}"#,
            limit in 0usize..400,
        ) {
            proptest::prop_assert_eq!(
                json_deeper_than(text.as_bytes(), limit),
                json_depth(text.as_bytes()) > limit
            );
        }
    }

    #[test]
    fn generated_ids_do_not_repeat_and_the_generator_rekeys() {
        let ids: std::collections::BTreeSet<String> =
            (0..10_000).map(|_| new_id("op_").expect("id")).collect();
        assert_eq!(ids.len(), 10_000);
        let mut g = Generator {
            key: [7; 32],
            counter: 0,
        };
        let (mut a, mut b) = ([0u8; 40], [0u8; 40]);
        g.fill(&mut a);
        g.fill(&mut b);
        assert_ne!(a, b);
        assert_ne!(g.key, [7; 32], "the key that produced `a` is gone");
    }

    #[test]
    fn os_random_bytes_fills_what_is_asked_and_differs_between_draws() {
        for n in [0, 1, 32, 300, 70_000] {
            assert_eq!(os_random_bytes(n).expect("random").len(), n);
        }
        let (a, b) = (os_random_bytes(64), os_random_bytes(64));
        assert_ne!(a.expect("random"), b.expect("random"));
        let big = os_random_bytes(70_000).expect("random");
        assert!(
            big.iter().any(|&x| x != 0),
            "a long draw is filled to its end"
        );
        assert!(big[69_000..].iter().any(|&x| x != 0));
    }

    #[test]
    fn unicode_sets_are_hidden() {
        use unicode_general_category::{GeneralCategory as G, get_general_category};
        for c in (0..=0x10ffff).filter_map(char::from_u32) {
            let must = matches!(
                get_general_category(c),
                G::Control | G::Format | G::LineSeparator | G::ParagraphSeparator
            );
            assert!(!must || hidden(c), "U+{:04X} is not hidden", c as u32);
        }
        // Default_Ignorable_Code_Point (DerivedCoreProperties) outside Cf, and the blanks.
        let ignorable = [
            0x34f, 0x115f, 0x1160, 0x17b4, 0x17b5, 0x180b, 0x180f, 0x2065, 0x2800, 0x3164, 0xfe00,
            0xfe0f, 0xffa0, 0xfff0, 0xfff8, 0xe0000, 0xe0100, 0xe01ef, 0xe0fff,
        ];
        for u in ignorable {
            assert!(
                char::from_u32(u).is_some_and(hidden),
                "U+{u:04X} is not hidden"
            );
        }
    }

    #[test]
    fn visible_spells_out_what_hides_and_keeps_ordinary_text() {
        let ordinary = "make test -j4 # héllo 世界 😀 ~/src";
        assert!(matches!(visible(ordinary), std::borrow::Cow::Borrowed(_)));
        assert_eq!(
            visible("a\u{9b}30Db\u{7f}\u{2028}\u{3164}\u{e0101}"),
            "a\\u{9b}30Db\\u{7f}\\u{2028}\\u{3164}\\u{e0101}"
        );
        for c in [
            'a',
            ' ',
            '\u{a0}',
            '\u{e9}',
            '\u{4e16}',
            '\u{1f600}',
            '\u{2013}',
        ] {
            assert!(!hidden(c), "{c:?}");
        }
    }

    #[test]
    fn sha256_of_empty_input_is_the_known_vector() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn base64url_round_trips_and_refuses_non_canonical_text() {
        for n in 0..40u8 {
            let bytes: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37).wrapping_add(n)).collect();
            let text = base64url(&bytes);
            assert!(!text.contains('='));
            assert_eq!(base64url_decode(&text), Some(bytes));
        }
        assert_eq!(base64url(b"\xfb\xff"), "-_8");
        assert_eq!(base64url_decode("-_9"), None, "stray low bits");
        assert_eq!(base64url_decode("a"), None);
        assert_eq!(base64url_decode("ab=="), None);
        assert_eq!(base64url_decode("a+b/"), None);
    }

    #[test]
    fn unhex32_inverts_hex_and_refuses_anything_else() {
        let bytes: Vec<u8> = (0..32).map(|i| i * 7).collect();
        assert_eq!(
            unhex32(&hex(&bytes)).map(|b| b.to_vec()),
            Some(bytes.clone())
        );
        let array: [u8; 32] = bytes.clone().try_into().unwrap();
        assert_eq!(hex32(&array).as_slice(), hex(&bytes).as_bytes());
        assert_eq!(
            unhex32(&"A".repeat(64)),
            None,
            "upper case is not canonical"
        );
        assert_eq!(unhex32(&"0".repeat(63)), None);
        assert_eq!(unhex32(&"g".repeat(64)), None);
    }

    #[test]
    fn ids_are_prefixed_base64url_of_18_bytes() {
        let id = new_id("op_").unwrap();
        assert_eq!(id.len(), 27);
        assert!(
            id[3..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_eq!(base64url(b"\xfb\xff"), "-_8");
        assert_ne!(new_id("op_").unwrap(), id);
    }

    proptest::proptest! {
        #[test]
        fn prop_bulk_map_equals_insertion(
            entries in proptest::collection::vec(("[a-c]{0,2}", proptest::num::u8::ANY), 0..40),
        ) {
            // JSON text with the entries in order, repeated keys included.
            let body: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{}:{v}", serde_json::to_string(k).unwrap()))
                .collect();
            let text = format!("{{{}}}", body.join(","));
            let inserted: std::collections::BTreeMap<String, u8> =
                serde_json::from_str(&text).unwrap();
            let mut de = serde_json::Deserializer::from_str(&text);
            let bulk: std::collections::BTreeMap<String, u8> = bulk_map(&mut de).unwrap();
            proptest::prop_assert_eq!(bulk, inserted);
        }
    }
}
