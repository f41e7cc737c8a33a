//! The codecs of Kafka record batches (attributes bits 0-2) and Kafka's varints.

use std::io::{Read, Write};

pub const NONE: u8 = 0;
pub const GZIP: u8 = 1;
pub const SNAPPY: u8 = 2;
pub const LZ4: u8 = 3;
pub const ZSTD: u8 = 4;

const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";

pub fn decompress(codec: u8, data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(data.len() * 4);
    match codec {
        GZIP => {
            flate2::read::MultiGzDecoder::new(data)
                .read_to_end(&mut out)
                .map_err(|e| format!("gzip: {e}"))?;
        }
        SNAPPY => return snappy_decompress(data),
        LZ4 => {
            lz4_flex::frame::FrameDecoder::new(data)
                .read_to_end(&mut out)
                .map_err(|e| format!("lz4: {e}"))?;
        }
        ZSTD => {
            zstd::stream::read::Decoder::new(data)
                .and_then(|mut decoder| decoder.read_to_end(&mut out))
                .map_err(|e| format!("zstd: {e}"))?;
        }
        other => return Err(format!("unknown compression codec {other}")),
    }
    Ok(out)
}

/// Raw snappy, or the xerial framing the Java client writes (header, then blocks of a
/// big-endian length and a raw snappy block).
fn snappy_decompress(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut raw = snap::raw::Decoder::new();
    if data.len() >= 16 && data.starts_with(XERIAL_MAGIC) {
        let mut out = Vec::new();
        let mut position = 16;
        while position + 4 <= data.len() {
            let length = u32::from_be_bytes(data[position..position + 4].try_into().unwrap()) as usize;
            position += 4;
            let block = data
                .get(position..position + length)
                .ok_or_else(|| "snappy: truncated xerial block".to_string())?;
            out.extend(raw.decompress_vec(block).map_err(|e| format!("snappy: {e}"))?);
            position += length;
        }
        if position != data.len() {
            return Err("snappy: bytes after the last xerial block".into());
        }
        return Ok(out);
    }
    raw.decompress_vec(data).map_err(|e| format!("snappy: {e}"))
}

pub fn compress(codec: u8, data: &[u8]) -> Result<Vec<u8>, String> {
    match codec {
        NONE => Ok(data.to_vec()),
        GZIP => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::with_capacity(data.len() / 2), flate2::Compression::default());
            encoder.write_all(data).map_err(|e| format!("gzip: {e}"))?;
            encoder.finish().map_err(|e| format!("gzip: {e}"))
        }
        SNAPPY => {
            // The xerial framing, as the Java producer writes it (every client reads it).
            let mut out = Vec::with_capacity(data.len() / 2 + 32);
            out.extend_from_slice(XERIAL_MAGIC);
            out.extend_from_slice(&1i32.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
            let mut raw = snap::raw::Encoder::new();
            for block in data.chunks(32 * 1024) {
                let compressed = raw.compress_vec(block).map_err(|e| format!("snappy: {e}"))?;
                out.extend_from_slice(&(compressed.len() as i32).to_be_bytes());
                out.extend_from_slice(&compressed);
            }
            Ok(out)
        }
        LZ4 => {
            let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::with_capacity(data.len() / 2));
            encoder.write_all(data).map_err(|e| format!("lz4: {e}"))?;
            encoder.finish().map_err(|e| format!("lz4: {e}"))
        }
        ZSTD => zstd::bulk::compress(data, 3).map_err(|e| format!("zstd: {e}")),
        other => Err(format!("unknown compression codec {other}")),
    }
}

/// A cursor over a byte slice that reads Kafka's big-endian integers and zigzag varints.
pub struct Cursor<'a> {
    pub data: &'a [u8],
    pub position: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data, position: 0 }
    }

    pub fn varlong(&mut self) -> Result<i64, String> {
        let mut value: u64 = 0;
        let mut shift = 0;
        loop {
            let byte = *self.data.get(self.position).ok_or("truncated varint")?;
            self.position += 1;
            value |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                if shift == 63 && byte > 1 {
                    // The tenth byte holds bit 63 only: more is a value beyond a long, which
                    // the shift cut silently (kafka-python, the reference, reads it whole).
                    return Err(beyond("a long", None));
                }
                break;
            }
            shift += 7;
            if shift > 63 {
                return Err("varint too long".into());
            }
        }
        Ok(((value >> 1) as i64) ^ -((value & 1) as i64))
    }

    /// A varint of Kafka's record format: an int32. A value beyond is corrupt data, never
    /// cut to its low 32 bits (an offset delta or a length read so is another record).
    pub fn varint(&mut self) -> Result<i32, String> {
        let value = self.varlong()?;
        if value as i32 as i64 != value {
            return Err(beyond("an int", Some(value)));
        }
        Ok(value as i32)
    }

    pub fn bytes(&mut self, length: usize) -> Result<&'a [u8], String> {
        let slice = self
            .data
            .get(self.position..self.position + length)
            .ok_or("truncated record")?;
        self.position += length;
        Ok(slice)
    }

    /// A varint length then that many bytes; None for length -1.
    pub fn nullable_bytes(&mut self) -> Result<Option<&'a [u8]>, String> {
        let length = self.varint()?;
        if length < 0 {
            return Ok(None);
        }
        self.bytes(length as usize).map(Some)
    }
}

#[cold]
#[inline(never)]
fn beyond(what: &str, value: Option<i64>) -> String {
    match value {
        Some(value) => format!("varint {value} beyond {what}"),
        None => format!("varint beyond {what}"),
    }
}

pub fn put_varlong(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag >= 0x80 {
        out.push((zigzag as u8) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

pub fn varlong_size(value: i64) -> usize {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    let mut size = 1;
    while zigzag >= 0x80 {
        zigzag >>= 7;
        size += 1;
    }
    size
}
