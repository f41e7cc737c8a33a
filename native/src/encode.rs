//! Rows (Arrow columns of Spark's Kafka sink) into record batches (format v2).
//!
//! Each batch is written without a producer: producer id, epoch and base sequence are -1
//! and the transactional bit is clear until `set_producer_state` stamps them when the
//! producer drains the batch (as kafka-python's own builder does); the CRC is recomputed
//! then. All records of a call share one timestamp (CreateTime), as a producer that stamps
//! records when they are sent would give them within a millisecond.

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{Array, ArrayRef, ListArray, StructArray};
use arrow_schema::DataType;

use crate::codec::{compress, put_varlong, varlong_size};
use crate::decode::BATCH_HEADER_BYTES;

pub struct EncodeRequest<'a> {
    pub rows: &'a StructArray,
    pub partitions: i32,
    pub sticky_partition: i32,
    pub max_batch_bytes: usize,
    pub max_record_bytes: usize,
    pub timestamp_ms: i64,
    pub codec: u8,
}

pub struct EncodedBatch {
    pub partition: i32,
    pub records: i32,
    pub bytes: Vec<u8>,
}

/// A nullable byte column: binary, large binary, string or large string.
enum Bytes<'a> {
    Missing,
    Binary(&'a arrow_array::BinaryArray),
    LargeBinary(&'a arrow_array::LargeBinaryArray),
    Utf8(&'a arrow_array::StringArray),
    LargeUtf8(&'a arrow_array::LargeStringArray),
}

impl<'a> Bytes<'a> {
    fn of(array: Option<&'a ArrayRef>, name: &str) -> Result<Self, String> {
        let Some(array) = array else { return Ok(Bytes::Missing) };
        Ok(match array.data_type() {
            DataType::Binary => Bytes::Binary(array.as_binary::<i32>()),
            DataType::LargeBinary => Bytes::LargeBinary(array.as_binary::<i64>()),
            DataType::Utf8 => Bytes::Utf8(array.as_string::<i32>()),
            DataType::LargeUtf8 => Bytes::LargeUtf8(array.as_string::<i64>()),
            DataType::Null => Bytes::Missing,
            other => return Err(format!("column {name} must be binary or string, not {other}")),
        })
    }

    fn get(&self, row: usize) -> Option<&'a [u8]> {
        match self {
            Bytes::Missing => None,
            Bytes::Binary(a) => a.is_valid(row).then(|| a.value(row)),
            Bytes::LargeBinary(a) => a.is_valid(row).then(|| a.value(row)),
            Bytes::Utf8(a) => a.is_valid(row).then(|| a.value(row).as_bytes()),
            Bytes::LargeUtf8(a) => a.is_valid(row).then(|| a.value(row).as_bytes()),
        }
    }
}

/// Kafka's murmur2 (the Java client's `Utils.murmur2`), for the default partitioner.
pub fn murmur2(data: &[u8]) -> i32 {
    let seed: u32 = 0x9747_b28c;
    let m: u32 = 0x5bd1_e995;
    let r = 24;
    let length = data.len();
    let mut h: u32 = seed ^ (length as u32);
    let chunks = length / 4;
    for i in 0..chunks {
        let mut k = u32::from_le_bytes(data[i * 4..i * 4 + 4].try_into().unwrap());
        k = k.wrapping_mul(m);
        k ^= k >> r;
        k = k.wrapping_mul(m);
        h = h.wrapping_mul(m);
        h ^= k;
    }
    let tail = &data[chunks * 4..];
    if tail.len() >= 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(m);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(m);
    h ^= h >> 15;
    h as i32
}

pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions
}

struct Open {
    records: Vec<u8>,
    count: i32,
}

pub fn encode(request: &EncodeRequest) -> Result<(Vec<EncodedBatch>, i32), String> {
    let rows = request.rows;
    let column = |name: &str| rows.column_by_name(name);
    let keys = Bytes::of(column("key"), "key")?;
    let values = Bytes::of(column("value"), "value")?;
    let partition_column = match column("partition") {
        Some(array) if array.data_type() == &DataType::Int32 => Some(array.as_primitive::<Int32Type>()),
        Some(array) if array.data_type() == &DataType::Null => None,
        Some(array) => return Err(format!("column partition must be int, not {}", array.data_type())),
        None => None,
    };
    let headers: Option<&ListArray> = match column("headers") {
        Some(array) if matches!(array.data_type(), DataType::List(_)) => Some(array.as_list::<i32>()),
        Some(array) if array.data_type() == &DataType::Null => None,
        Some(array) => {
            return Err(format!("column headers must be array<struct<key string, value binary>>, not {}", array.data_type()))
        }
        None => None,
    };
    let (header_keys, header_values) = match headers {
        Some(list) => {
            let items = list.values().as_struct();
            (Bytes::of(items.column_by_name("key"), "headers.key")?, Bytes::of(items.column_by_name("value"), "headers.value")?)
        }
        None => (Bytes::Missing, Bytes::Missing),
    };
    if request.partitions <= 0 {
        return Err("the topic has no partitions".into());
    }
    let mut open: Vec<Option<Open>> = (0..request.partitions).map(|_| None).collect();
    let mut done: Vec<EncodedBatch> = Vec::new();
    let mut sticky = request.sticky_partition.rem_euclid(request.partitions);
    let mut record = Vec::with_capacity(256);
    let count = |slot: &Option<Open>| slot.as_ref().map_or(0, |batch| batch.count) as i64;
    let full = |slot: &Option<Open>, length: usize| {
        slot.as_ref().is_some_and(|batch| {
            batch.count > 0 && BATCH_HEADER_BYTES + batch.records.len() + length > request.max_batch_bytes
        })
    };
    for row in 0..rows.len() {
        let key = keys.get(row);
        let value = values.get(row);
        let explicit = partition_column.and_then(|p| p.is_valid(row).then(|| p.value(row)));
        let unkeyed = explicit.is_none() && key.is_none();
        let mut target = match (explicit, key) {
            (Some(p), _) if p < 0 || p >= request.partitions => {
                return Err(format!(
                    "a row asks for partition {p}, but the topic has {} partitions",
                    request.partitions
                ))
            }
            (Some(p), _) => p,
            (None, Some(key)) => partition_for_key(key, request.partitions),
            (None, None) => sticky,
        };
        record.clear();
        write_record(&mut record, count(&open[target as usize]), key, value, headers, &header_keys, &header_values, row)?;
        let single_batch_bytes = BATCH_HEADER_BYTES + record.len();
        if single_batch_bytes > request.max_record_bytes {
            return Err(format!(
                "a record of {single_batch_bytes} bytes (key, value and headers) is larger than max.request.size ({} bytes)",
                request.max_record_bytes
            ));
        }
        if full(&open[target as usize], record.len()) {
            done.push(close(target, open[target as usize].take().unwrap(), request)?);
            if unkeyed {
                sticky = (sticky + 1) % request.partitions;
                target = sticky;
                record.clear();
                write_record(&mut record, count(&open[target as usize]), key, value, headers, &header_keys, &header_values, row)?;
                if full(&open[target as usize], record.len()) {
                    done.push(close(target, open[target as usize].take().unwrap(), request)?);
                }
            }
            record.clear();
            write_record(&mut record, count(&open[target as usize]), key, value, headers, &header_keys, &header_values, row)?;
        }
        let batch = open[target as usize].get_or_insert_with(|| Open {
            records: Vec::with_capacity(request.max_batch_bytes.min(1 << 20)),
            count: 0,
        });
        batch.records.extend_from_slice(&record);
        batch.count += 1;
    }
    for (partition, slot) in open.into_iter().enumerate() {
        if let Some(batch) = slot {
            done.push(close(partition as i32, batch, request)?);
        }
    }
    Ok((done, sticky))
}

#[allow(clippy::too_many_arguments)]
fn write_record(
    out: &mut Vec<u8>,
    offset_delta: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: Option<&ListArray>,
    header_keys: &Bytes,
    header_values: &Bytes,
    row: usize,
) -> Result<(), String> {
    let (header_start, header_end) = match headers {
        Some(list) if list.is_valid(row) => {
            let offsets = list.value_offsets();
            (offsets[row] as usize, offsets[row + 1] as usize)
        }
        _ => (0, 0),
    };
    let nullable_size = |bytes: Option<&[u8]>| match bytes {
        Some(b) => varlong_size(b.len() as i64) + b.len(),
        None => 1,
    };
    let mut body = 1 + 1 + varlong_size(offset_delta) + nullable_size(key) + nullable_size(value);
    body += varlong_size((header_end - header_start) as i64);
    for item in header_start..header_end {
        let header_key = header_keys.get(item).ok_or("a header has a null key")?;
        body += varlong_size(header_key.len() as i64) + header_key.len() + nullable_size(header_values.get(item));
    }
    put_varlong(out, body as i64);
    out.push(0); // attributes
    out.push(0); // timestamp delta 0
    put_varlong(out, offset_delta);
    put_nullable(out, key);
    put_nullable(out, value);
    put_varlong(out, (header_end - header_start) as i64);
    for item in header_start..header_end {
        put_nullable(out, header_keys.get(item));
        put_nullable(out, header_values.get(item));
    }
    Ok(())
}

fn put_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        Some(b) => {
            put_varlong(out, b.len() as i64);
            out.extend_from_slice(b);
        }
        None => put_varlong(out, -1),
    }
}

fn close(partition: i32, batch: Open, request: &EncodeRequest) -> Result<EncodedBatch, String> {
    let compressed = compress(request.codec, &batch.records)?;
    // As kafka-python and the Java client do: no gain, no compression.
    let (codec, payload) = if request.codec != 0 && compressed.len() < batch.records.len() {
        (request.codec, compressed)
    } else {
        (0, batch.records)
    };
    let mut out = Vec::with_capacity(BATCH_HEADER_BYTES + payload.len());
    out.extend_from_slice(&0i64.to_be_bytes()); // base offset
    out.extend_from_slice(&((BATCH_HEADER_BYTES - 12 + payload.len()) as i32).to_be_bytes());
    out.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    out.push(2); // magic
    out.extend_from_slice(&0u32.to_be_bytes()); // crc, below
    out.extend_from_slice(&(codec as i16).to_be_bytes()); // attributes
    out.extend_from_slice(&(batch.count - 1).to_be_bytes()); // last offset delta
    out.extend_from_slice(&request.timestamp_ms.to_be_bytes()); // base timestamp
    out.extend_from_slice(&request.timestamp_ms.to_be_bytes()); // max timestamp
    out.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    out.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    out.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    out.extend_from_slice(&batch.count.to_be_bytes());
    out.extend_from_slice(&payload);
    stamp_crc(&mut out);
    Ok(EncodedBatch { partition, records: batch.count, bytes: out })
}

pub fn stamp_crc(batch: &mut [u8]) {
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// Producer id, epoch, base sequence and the transactional bit, then the CRC again.
pub fn set_producer_state(batch: &mut [u8], producer_id: i64, epoch: i16, base_sequence: i32, transactional: bool) -> Result<(), String> {
    if batch.len() < BATCH_HEADER_BYTES || batch[16] != 2 {
        return Err("not a record batch of format v2".into());
    }
    let mut attributes = i16::from_be_bytes([batch[21], batch[22]]);
    if transactional {
        attributes |= 0x10;
    } else {
        attributes &= !0x10;
    }
    batch[21..23].copy_from_slice(&attributes.to_be_bytes());
    batch[43..51].copy_from_slice(&producer_id.to_be_bytes());
    batch[51..53].copy_from_slice(&epoch.to_be_bytes());
    batch[53..57].copy_from_slice(&base_sequence.to_be_bytes());
    stamp_crc(batch);
    Ok(())
}

pub fn as_struct(array: &ArrayRef) -> Result<&StructArray, String> {
    array.as_struct_opt().ok_or_else(|| "rows must be a struct (a record batch)".to_string())
}
