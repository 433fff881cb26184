//! Compact JSON written straight into a byte buffer: a serde `Serializer` whose output is
//! byte-for-byte what `serde_json::to_writer` writes, with string escaping that checks 16
//! bytes at a time instead of one (prose-heavy replies spend most of their encoding time
//! there), and [`Raw`], already-encoded JSON spliced in without being parsed or escaped again.

use std::fmt::Display;

use serde::ser::{self, Serialize};

/// serde_json's marker for a raw value: a struct of this name with one field of this name
/// holding JSON text is written verbatim by serde_json's serializers (this is how
/// `RawValue` serializes); [`Raw`] and this writer use it too.
const RAW_TOKEN: &str = "$serde_json::private::RawValue";
/// serde_json's marker for an arbitrary-precision number (a `Value` number): its digits.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// Why encoding failed: a map key that is not a string, or a `Serialize` impl that failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Error(String);

impl ser::Error for Error {
    fn custom<T: Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

/// JSON text that is already encoded, written as is by every serde_json serializer and this
/// one. Only ever built from this module's output (or other valid JSON), so it needs no check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw(String);

impl Raw {
    /// `null`.
    pub fn null() -> Raw {
        Raw("null".to_owned())
    }

    pub fn get(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// Text serde_json wrote (valid JSON by construction).
    pub fn from_serde_json(text: String) -> Raw {
        Raw(text)
    }
}

impl Serialize for Raw {
    fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use ser::SerializeStruct as _;
        let mut st = s.serialize_struct(RAW_TOKEN, 1)?;
        st.serialize_field(RAW_TOKEN, self.0.as_str())?;
        st.end()
    }
}

/// Appends `value` as compact JSON to `out`.
pub fn write<T: ?Sized + Serialize>(out: &mut Vec<u8>, value: &T) -> Result<(), Error> {
    value.serialize(&mut Writer { out })
}

/// `value` as compact JSON text.
pub fn to_raw<T: ?Sized + Serialize>(value: &T) -> Result<Raw, Error> {
    let mut out = Vec::with_capacity(1024);
    write(&mut out, value)?;
    into_raw(out)
}

/// Wraps bytes this module wrote (always UTF-8: only `str` contents and ASCII go in).
pub fn into_raw(out: Vec<u8>) -> Result<Raw, Error> {
    String::from_utf8(out)
        .map(Raw)
        .map_err(|_| Error("encoded JSON is not UTF-8".into()))
}

// ----- escaping ------------------------------------------------------------------------------

/// Whether `b` must be escaped inside a JSON string.
#[inline(always)]
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Whether any byte of a 16-byte chunk must be escaped: no early exit inside, which the
/// compiler turns into a few vector compares.
#[inline(always)]
fn chunk_dirty(chunk: &[u8]) -> bool {
    let mut dirty = false;
    for &b in &chunk[..16] {
        dirty |= needs_escape(b);
    }
    dirty
}

/// The escape sequence of `b` (a byte that must be escaped), as serde_json writes it, padded
/// to 8 bytes so it is stored with one fixed-size copy, and its length.
#[inline(always)]
fn escape_sequence(b: u8) -> ([u8; 8], usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let short = match b {
        b'"' => b'"',
        b'\\' => b'\\',
        b'\n' => b'n',
        b'\r' => b'r',
        b'\t' => b't',
        0x08 => b'b',
        0x0c => b'f',
        _ => {
            let (hi, lo) = (HEX[(b >> 4) as usize], HEX[(b & 0xf) as usize]);
            return ([b'\\', b'u', b'0', b'0', hi, lo, 0, 0], 6);
        }
    };
    ([b'\\', short, 0, 0, 0, 0, 0, 0], 2)
}

/// Appends the escaped contents of a JSON string (no quotes), as serde_json escapes them.
/// Clean 16-byte chunks are checked at once and left to be copied as one run (prose has few
/// bytes to escape). A chunk holding some is escaped on its own ([`escape_chunk`]), so text
/// dense with quotes (JSON inside a string, as an MCP tool's text content) costs neither a
/// search nor a copy call per quote.
pub fn escape_into(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let (chunks, tail) = bytes.as_chunks::<16>();
    // Where the bytes not yet written begin.
    let mut run = 0;
    for (k, chunk) in chunks.iter().enumerate() {
        if chunk_dirty(chunk) {
            out.extend_from_slice(&bytes[run..k * 16]);
            escape_chunk(out, chunk, 0);
            run = k * 16 + 16;
        }
    }
    if !tail.is_empty() {
        // The last 16 bytes (the first `skip` of them already written), or the short string
        // padded with clean bytes, which are cut off again.
        let mut pad = [b' '; 16];
        let (last, skip, padding) = match bytes.last_chunk::<16>() {
            Some(last) => (last, 16 - tail.len(), 0),
            None => {
                pad[..tail.len()].copy_from_slice(tail);
                (&pad, 0, 16 - tail.len())
            }
        };
        if chunk_dirty(last) {
            out.extend_from_slice(&bytes[run..bytes.len() - tail.len()]);
            escape_chunk(out, last, skip);
            out.truncate(out.len() - padding);
            run = bytes.len();
        }
    }
    out.extend_from_slice(&bytes[run..]);
}

/// Room a chunk's escaping writes into: every byte escaped as `\u00XX`, plus one whole chunk
/// copied past the end.
const CHUNK_ROOM: usize = 16 * 6 + 16;

/// Appends `chunk` (which holds bytes to escape) escaped, its first `skip` bytes left out.
/// The marked bytes are found 8 at a time ([`escapes8`]); each clean stretch and each escape
/// is stored with one fixed-size copy through a cursor into room made once, which is cut back
/// to what was written: no length-dependent copy call per quote.
#[inline(always)]
fn escape_chunk(out: &mut Vec<u8>, chunk: &[u8; 16], skip: usize) {
    // The chunk, then zeros: a 16-byte copy from any offset in it stays inside.
    let mut src = [0u8; 32];
    src[..16].copy_from_slice(chunk);
    let (halves, _) = chunk.as_chunks::<8>();
    let mut marks = 0u32;
    for (h, half) in halves.iter().enumerate() {
        marks |= gather_high_bits(escapes8(u64::from_le_bytes(*half))) << (h * 8);
    }
    marks &= u32::MAX << skip;
    let at = out.len();
    out.resize(at + CHUNK_ROOM, 0);
    let room = &mut out[at..];
    let (mut len, mut from) = (0, skip);
    while marks != 0 {
        let j = marks.trailing_zeros() as usize;
        room[len..len + 16].copy_from_slice(&src[from..from + 16]);
        len += j - from;
        let (sequence, n) = escape_sequence(src[j]);
        room[len..len + 8].copy_from_slice(&sequence);
        len += n;
        from = j + 1;
        marks &= marks - 1;
    }
    room[len..len + 16].copy_from_slice(&src[from..from + 16]);
    len += 16 - from;
    out.truncate(at + len);
}

/// The high bit of each byte of `marks` (only high bits set), gathered into bits 0..8: the
/// multiplier moves byte k's bit to bit 56 + k, and no two partial products meet.
#[inline(always)]
fn gather_high_bits(marks: u64) -> u32 {
    ((marks >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u32
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
const LOW_BITS: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// The high bit of each byte of `x` that is zero (exact: no carry crosses bytes).
#[inline(always)]
fn zero_bytes(x: u64) -> u64 {
    !(((x & LOW_BITS).wrapping_add(LOW_BITS)) | x | LOW_BITS)
}

/// The high bit of each of the 8 bytes in `w` (little-endian) that must be escaped: a control
/// byte (below 0x20: adding 0x60 to its low 7 bits leaves the high bit clear), a quote or a
/// backslash.
#[inline(always)]
fn escapes8(w: u64) -> u64 {
    let controls = !(((w & LOW_BITS).wrapping_add(ONES * 0x60)) | w) & HIGH_BITS;
    controls | zero_bytes(w ^ (ONES * u64::from(b'"'))) | zero_bytes(w ^ (ONES * u64::from(b'\\')))
}

/// Appends `s` as a quoted JSON string.
#[inline]
pub fn string_into(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    escape_into(out, s);
    out.push(b'"');
}

// ----- the serializer ------------------------------------------------------------------------

struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    fn int(&mut self, v: impl itoa::Integer) {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    }

    /// Floats the way serde_json writes them (shortest round-trip digits; null if not finite).
    fn float<F: Serialize>(&mut self, v: F) -> Result<(), Error> {
        serde_json::to_writer(&mut *self.out, &v).map_err(|e| Error(e.to_string()))
    }
}

/// A sequence, map or struct being written: whether a separator is due.
struct Compound<'w, 'a> {
    w: &'w mut Writer<'a>,
    first: bool,
    /// Closing bytes: `]`, `}`, or `]}`/`}}` for enum variants.
    close: &'static [u8],
    /// Inside a raw-value or number marker struct: its one field is written verbatim.
    raw: bool,
}

impl<'w, 'a> Compound<'w, 'a> {
    fn open(w: &'w mut Writer<'a>, open: &[u8], close: &'static [u8]) -> Self {
        w.out.extend_from_slice(open);
        Compound {
            w,
            first: true,
            close,
            raw: false,
        }
    }

    fn sep(&mut self) {
        if !self.first {
            self.w.out.push(b',');
        }
        self.first = false;
    }

    fn key(&mut self, key: &str) {
        // One capacity check for the separator, quotes and colon.
        self.w.out.reserve(key.len() + 4);
        self.sep();
        self.w.out.push(b'"');
        escape_into(self.w.out, key);
        self.w.out.extend_from_slice(b"\":");
    }

    fn end(self) {
        self.w.out.extend_from_slice(self.close);
    }
}

/// Opens `{"variant":` for the enum variant forms.
fn open_variant<'w, 'a>(
    w: &'w mut Writer<'a>,
    variant: &str,
    open: &[u8],
    close: &'static [u8],
) -> Compound<'w, 'a> {
    w.out.push(b'{');
    string_into(w.out, variant);
    w.out.push(b':');
    Compound::open(w, open, close)
}

impl<'w, 'a> ser::Serializer for &'w mut Writer<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'w, 'a>;
    type SerializeTuple = Compound<'w, 'a>;
    type SerializeTupleStruct = Compound<'w, 'a>;
    type SerializeTupleVariant = Compound<'w, 'a>;
    type SerializeMap = Compound<'w, 'a>;
    type SerializeStruct = Compound<'w, 'a>;
    type SerializeStructVariant = Compound<'w, 'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }
    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }
    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }
    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }
    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.float(v)
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        self.float(v)
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        string_into(self.out, v.encode_utf8(&mut [0u8; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        string_into(self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        use ser::SerializeSeq as _;
        let mut seq = self.serialize_seq(Some(v.len()))?;
        for b in v {
            seq.serialize_element(b)?;
        }
        ser::SerializeSeq::end(seq)
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Error> {
        self.serialize_none()
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.out.push(b'{');
        string_into(self.out, variant);
        self.out.push(b':');
        value.serialize(&mut *self)?;
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Compound<'w, 'a>, Error> {
        Ok(Compound::open(self, b"[", b"]"))
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'w, 'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        len: usize,
    ) -> Result<Compound<'w, 'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'w, 'a>, Error> {
        Ok(open_variant(self, variant, b"[", b"]}"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Compound<'w, 'a>, Error> {
        Ok(Compound::open(self, b"{", b"}"))
    }
    fn serialize_struct(self, name: &'static str, _: usize) -> Result<Compound<'w, 'a>, Error> {
        if name == RAW_TOKEN || name == NUMBER_TOKEN {
            return Ok(Compound {
                w: self,
                first: true,
                close: b"",
                raw: true,
            });
        }
        self.serialize_map(None)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'w, 'a>, Error> {
        Ok(open_variant(self, variant, b"{", b"}}"))
    }
}

impl ser::SerializeSeq for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        self.sep();
        value.serialize(&mut *self.w)
    }
    fn end(self) -> Result<(), Error> {
        Compound::end(self);
        Ok(())
    }
}

impl ser::SerializeTuple for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<(), Error> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<(), Error> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<(), Error> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), Error> {
        self.sep();
        key.serialize(KeyWriter { out: self.w.out })?;
        self.w.out.push(b':');
        Ok(())
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(&mut *self.w)
    }
    fn end(self) -> Result<(), Error> {
        Compound::end(self);
        Ok(())
    }
}

impl ser::SerializeStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        if self.raw {
            return value.serialize(RawWriter { out: self.w.out });
        }
        self.key(key);
        value.serialize(&mut *self.w)
    }
    fn end(self) -> Result<(), Error> {
        Compound::end(self);
        Ok(())
    }
}

impl ser::SerializeStructVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        ser::SerializeStruct::serialize_field(self, key, value)
    }
    fn end(self) -> Result<(), Error> {
        Compound::end(self);
        Ok(())
    }
}

// ----- map keys and raw text -----------------------------------------------------------------

fn not_a_string() -> Error {
    Error("a map key must be a string".into())
}

/// Map keys: strings, or integers, booleans and chars written as strings (as serde_json does).
struct KeyWriter<'a> {
    out: &'a mut Vec<u8>,
}

impl KeyWriter<'_> {
    fn quoted(self, text: &str) -> Result<(), Error> {
        string_into(self.out, text);
        Ok(())
    }
}

macro_rules! int_keys {
    ($($f:ident: $t:ty),*) => {$(
        fn $f(self, v: $t) -> Result<(), Error> {
            self.quoted(itoa::Buffer::new().format(v))
        }
    )*};
}

macro_rules! refuse {
    ($($f:ident: $t:ty),*) => {$(
        fn $f(self, _: $t) -> Result<(), Error> {
            Err(not_a_string())
        }
    )*};
}

impl ser::Serializer for KeyWriter<'_> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = ser::Impossible<(), Error>;
    type SerializeTuple = ser::Impossible<(), Error>;
    type SerializeTupleStruct = ser::Impossible<(), Error>;
    type SerializeTupleVariant = ser::Impossible<(), Error>;
    type SerializeMap = ser::Impossible<(), Error>;
    type SerializeStruct = ser::Impossible<(), Error>;
    type SerializeStructVariant = ser::Impossible<(), Error>;

    int_keys!(serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
        serialize_i128: i128, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_u128: u128);
    refuse!(serialize_f32: f32, serialize_f64: f64, serialize_bytes: &[u8]);

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.quoted(if v { "true" } else { "false" })
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.quoted(v.encode_utf8(&mut [0u8; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.quoted(v)
    }
    fn serialize_none(self) -> Result<(), Error> {
        Err(not_a_string())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<(), Error> {
        Err(not_a_string())
    }
    fn serialize_unit(self) -> Result<(), Error> {
        Err(not_a_string())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Error> {
        Err(not_a_string())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, v: &'static str) -> Result<(), Error> {
        self.quoted(v)
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Error> {
        Err(not_a_string())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(not_a_string())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        Err(not_a_string())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(not_a_string())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(not_a_string())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(not_a_string())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Error> {
        Err(not_a_string())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(not_a_string())
    }
}

/// The one field of a raw-value or number marker: its text goes out as is.
struct RawWriter<'a> {
    out: &'a mut Vec<u8>,
}

fn not_raw() -> Error {
    Error("a raw value must be JSON text".into())
}

macro_rules! refuse_raw {
    ($($f:ident: $t:ty),*) => {$(
        fn $f(self, _: $t) -> Result<(), Error> {
            Err(not_raw())
        }
    )*};
}

impl ser::Serializer for RawWriter<'_> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = ser::Impossible<(), Error>;
    type SerializeTuple = ser::Impossible<(), Error>;
    type SerializeTupleStruct = ser::Impossible<(), Error>;
    type SerializeTupleVariant = ser::Impossible<(), Error>;
    type SerializeMap = ser::Impossible<(), Error>;
    type SerializeStruct = ser::Impossible<(), Error>;
    type SerializeStructVariant = ser::Impossible<(), Error>;

    refuse_raw!(serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32,
        serialize_i64: i64, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_f32: f32, serialize_f64: f64, serialize_char: char,
        serialize_bytes: &[u8]);

    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.out.extend_from_slice(v.as_bytes());
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Error> {
        Err(not_raw())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<(), Error> {
        Err(not_raw())
    }
    fn serialize_unit(self) -> Result<(), Error> {
        Err(not_raw())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Error> {
        Err(not_raw())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), Error> {
        Err(not_raw())
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Error> {
        Err(not_raw())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(not_raw())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        Err(not_raw())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(not_raw())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(not_raw())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(not_raw())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Error> {
        Err(not_raw())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(not_raw())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn ours<T: Serialize>(v: &T) -> String {
        to_raw(v).unwrap().into_string()
    }

    #[test]
    fn raw_text_is_spliced_by_serde_json_and_by_this_writer() {
        let raw = to_raw(&json!({"a": [1, "x\"y"]})).unwrap();
        let outer = json!({"k": 1});
        #[derive(serde::Serialize)]
        struct Holder<'a> {
            before: &'a Value,
            raw: &'a Raw,
        }
        let h = Holder {
            before: &outer,
            raw: &raw,
        };
        let expected = r#"{"before":{"k":1},"raw":{"a":[1,"x\"y"]}}"#;
        assert_eq!(serde_json::to_string(&h).unwrap(), expected);
        assert_eq!(ours(&h), expected);
        assert_eq!(
            serde_json::to_value(&h).unwrap(),
            serde_json::from_str::<Value>(expected).unwrap()
        );
        let boxed: Box<serde_json::value::RawValue> =
            serde_json::from_str(r#"{"z":[true,null]}"#).unwrap();
        assert_eq!(ours(&boxed), r#"{"z":[true,null]}"#);
    }

    #[test]
    fn enums_options_and_keys_match_serde_json() {
        #[derive(serde::Serialize)]
        enum E {
            Unit,
            New(u8),
            Tup(u8, &'static str),
            St { a: i64, b: Option<bool> },
        }
        let mut keyed = std::collections::BTreeMap::new();
        keyed.insert(3u32, "three");
        keyed.insert(10u32, "ten");
        let v = (
            vec![E::Unit, E::New(7), E::Tup(1, "t"), E::St { a: -5, b: None }],
            keyed,
            ('c', 1.5f64, f64::NAN, u128::MAX, -3i8, ()),
            json!({"n": 12345678901234567890u64, "f": 0.1, "s": "\u{0}\u{1f}\u{7f}"}),
        );
        assert_eq!(ours(&v), serde_json::to_string(&v).unwrap());
    }

    /// Every byte value at every position of a word is marked exactly when it must be
    /// escaped, whatever its neighbours are (no carry crosses bytes).
    #[test]
    fn each_byte_of_a_word_is_marked_exactly_when_it_must_be_escaped() {
        for b in 0..=255u8 {
            for pos in 0..8 {
                for fill in [0u8, b' ', b'"', 0x7f, 0x80, 0xff] {
                    let mut word = [fill; 8];
                    word[pos] = b;
                    let marks = escapes8(u64::from_le_bytes(word));
                    for (i, &byte) in word.iter().enumerate() {
                        let marked = marks & (0x80 << (8 * i)) != 0;
                        assert_eq!(marked, needs_escape(byte), "{word:?} byte {i}");
                    }
                    assert_eq!(marks & !HIGH_BITS, 0, "{word:?}");
                }
            }
        }
    }

    #[test]
    fn gathering_marks_keeps_each_bytes_mark_at_its_position() {
        for bits in 0..=255u32 {
            let marks = (0..8)
                .filter(|k| bits & (1 << k) != 0)
                .fold(0u64, |m, k| m | 0x80 << (8 * k));
            assert_eq!(gather_high_bits(marks), bits, "{marks:#x}");
        }
    }

    /// Every byte escaped, and as the longest form (`\u00XX`, 6 bytes for 1): a chunk's room
    /// holds its worst case, at every length and so at every overlap of the last chunk.
    #[test]
    fn text_made_only_of_bytes_to_escape_escapes_as_serde_json_does() {
        for len in 0..50 {
            for fill in ["\u{1}", "\"", "\\", "\u{1f}\n", "\u{1}é"] {
                let text: String = fill.repeat(len).chars().take(len).collect();
                assert_eq!(
                    ours(&text),
                    serde_json::to_string(&text).unwrap(),
                    "{text:?}"
                );
            }
        }
    }

    /// Every length around the 16-byte chunks, with a byte to escape at each position (the
    /// overlapping last chunk must neither repeat nor drop one).
    #[test]
    fn escapes_at_every_position_of_every_short_length() {
        for len in 0..50 {
            for pos in 0..len {
                for special in ['"', '\\', '\n', '\u{1}'] {
                    let mut text: Vec<char> = "abcdefghij".chars().cycle().take(len).collect();
                    text[pos] = special;
                    if pos + 3 < len {
                        text[pos + 3] = '"';
                    }
                    let text: String = text.into_iter().collect();
                    assert_eq!(
                        ours(&text),
                        serde_json::to_string(&text).unwrap(),
                        "{text:?}"
                    );
                }
            }
        }
    }

    proptest! {
        #[test]
        fn strings_escape_as_serde_json_does(
            s in any::<String>(),
            t in "[ -~\\n\\t\\u{0}-\\u{1f}\"\\\\é日]{0,80}",
            dense in "[a-z\"\\\\{}:,\\n]{0,200}",
        ) {
            for text in [&s, &t, &dense] {
                prop_assert_eq!(ours(text), serde_json::to_string(text).unwrap());
            }
        }
    }
}
