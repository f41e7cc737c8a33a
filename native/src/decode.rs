//! Fetch response record data (record batch format v2) into Arrow columns.
//!
//! The rules are kafka-python's `Fetcher.PartitionRecords` (the reference path), which
//! are the Java consumer's: records below the fetch offset are dropped, control batches
//! are skipped, and with read_committed a transactional batch is dropped while its producer
//! id is in the aborted set, which the response's aborted-transactions list fills (by first
//! offset) and the producer's abort marker empties. The next fetch offset follows the last
//! batch read (so compaction gaps and markers are stepped over).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use arrow_array::builder::{ArrayBuilder, BinaryBuilder, Int32Builder, Int64Builder, StringBuilder};
use arrow_array::{Array, ArrayRef, Int32Array, ListArray, StringArray, StructArray, TimestampMicrosecondArray};
use arrow_buffer::{BooleanBufferBuilder, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Fields, TimeUnit};

use crate::codec::{decompress, Cursor};

pub const BATCH_HEADER_BYTES: usize = 61;

pub struct DecodeRequest<'a> {
    pub raw: &'a [u8],
    pub fetch_offset: i64,
    pub topic: &'a str,
    pub partition: i32,
    pub read_committed: bool,
    /// (producer id, first offset) of the response's aborted transactions.
    pub aborted: Vec<(i64, i64)>,
    pub include_headers: bool,
    pub check_crcs: bool,
}

pub struct Decoded {
    pub columns: StructArray,
    pub next_fetch_offset: i64,
    pub leader_epoch: i32,
}

pub enum DecodeError {
    /// A message set of magic 0 or 1: the reference path decodes those.
    Legacy,
    Corrupt(String),
    /// A record's timestamp that Spark's TimestampType (microseconds in a long) cannot hold.
    TimestampOutOfRange(String),
}

/// Milliseconds since the epoch that still fit Spark's TimestampType as microseconds in a
/// long: Spark's own Kafka source multiplies with `Math.multiplyExact` and fails beyond.
pub const MAX_TIMESTAMP_MILLIS: i64 = i64::MAX / 1000;
pub const MIN_TIMESTAMP_MILLIS: i64 = i64::MIN / 1000;

/// The one-line error of a record timestamp out of Spark's range; the reference path
/// (`record_batches.timestamp_out_of_range`) words it the same.
pub fn timestamp_out_of_range(topic: &str, partition: i32, offset: i64, millis: i128) -> String {
    format!(
        "Record {topic}-{partition} at offset {offset} has timestamp {millis} ms, outside what \
         Spark's TimestampType holds ({MIN_TIMESTAMP_MILLIS} to {MAX_TIMESTAMP_MILLIS} ms since \
         the epoch; Spark's own Kafka source fails on it too): fix the producer's timestamps \
         (milliseconds since the epoch) or skip these offsets with startingOffsets"
    )
}

/// A record's failure: malformed bytes, or a well-formed record Spark cannot represent.
enum RecordError {
    Malformed(String),
    Timestamp { offset: i64, millis: i128 },
}

impl From<String> for RecordError {
    fn from(message: String) -> Self {
        RecordError::Malformed(message)
    }
}

impl From<&str> for RecordError {
    fn from(message: &str) -> Self {
        RecordError::Malformed(message.to_string())
    }
}

struct Columns {
    keys: BinaryBuilder,
    values: BinaryBuilder,
    offsets: Int64Builder,
    timestamps: Vec<i64>,
    timestamp_types: Int32Builder,
    header_offsets: Vec<i32>,
    header_valid: BooleanBufferBuilder,
    header_keys: StringBuilder,
    header_values: BinaryBuilder,
}

pub fn header_fields() -> Fields {
    Fields::from(vec![
        Field::new("key", DataType::Utf8, true),
        Field::new("value", DataType::Binary, true),
    ])
}

pub fn headers_type() -> DataType {
    DataType::List(Arc::new(Field::new("element", DataType::Struct(header_fields()), true)))
}

fn read_i64(data: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(data[at..at + 8].try_into().unwrap())
}
fn read_i32(data: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(data[at..at + 4].try_into().unwrap())
}
fn read_i16(data: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(data[at..at + 2].try_into().unwrap())
}

pub fn decode(request: &DecodeRequest) -> Result<Decoded, DecodeError> {
    let raw = request.raw;
    let capacity = raw.len() / 64 + 16;
    let mut columns = Columns {
        keys: BinaryBuilder::with_capacity(capacity, 0),
        values: BinaryBuilder::with_capacity(capacity, raw.len()),
        offsets: Int64Builder::with_capacity(capacity),
        timestamps: Vec::with_capacity(capacity),
        timestamp_types: Int32Builder::with_capacity(capacity),
        header_offsets: vec![0],
        header_valid: BooleanBufferBuilder::new(capacity),
        header_keys: StringBuilder::new(),
        header_values: BinaryBuilder::new(),
    };
    let mut aborted: VecDeque<(i64, i64)> = {
        let mut list = request.aborted.clone();
        list.sort_by_key(|(_, first_offset)| *first_offset);
        list.into()
    };
    let mut aborted_producers: HashSet<i64> = HashSet::new();
    let mut next_fetch_offset = request.fetch_offset;
    let mut leader_epoch = -1;
    let mut position = 0usize;
    let mut last_batch_next_offset: Option<i64> = None;
    while raw.len() - position >= 17 {
        let length = read_i32(raw, position + 8);
        if length < 0 {
            return Err(DecodeError::Corrupt(format!("negative batch length {length}")));
        }
        let end = position + 12 + length as usize;
        if end > raw.len() {
            break; // a partial batch at the end of the response: fetched again next time
        }
        let magic = raw[position + 16];
        if magic < 2 {
            return Err(DecodeError::Legacy);
        }
        if end - position < BATCH_HEADER_BYTES {
            return Err(DecodeError::Corrupt("record batch shorter than its header".into()));
        }
        let batch = &raw[position..end];
        position = end;
        let base_offset = read_i64(batch, 0);
        if request.check_crcs {
            let stored = read_i32(batch, 17) as u32;
            if crc32c::crc32c(&batch[21..]) != stored {
                return Err(DecodeError::Corrupt(format!(
                    "Record batch for partition {}-{} at offset {} failed crc check",
                    request.topic, request.partition, base_offset
                )));
            }
        }
        leader_epoch = read_i32(batch, 12);
        let attributes = read_i16(batch, 21);
        let last_offset_delta = read_i32(batch, 23) as i64;
        let Some(last_offset) =
            base_offset.checked_add(last_offset_delta).filter(|last| *last < i64::MAX)
        else {
            return Err(DecodeError::Corrupt(format!(
                "the record batch at offset {base_offset} of {}-{} has a last offset beyond \
                 the largest offset Kafka can hold",
                request.topic, request.partition
            )));
        };
        let batch_next_offset = last_offset + 1;
        last_batch_next_offset = Some(batch_next_offset);
        let producer_id = read_i64(batch, 43);
        let transactional = attributes & 0x10 != 0;
        let control = attributes & 0x20 != 0;
        if request.read_committed && producer_id >= 0 {
            while let Some(&(aborted_producer, first_offset)) = aborted.front() {
                if first_offset > last_offset {
                    break;
                }
                aborted_producers.insert(aborted_producer);
                aborted.pop_front();
            }
            if control {
                if is_abort_marker(batch).map_err(|error| {
                    DecodeError::Corrupt(format!(
                        "malformed control record in the batch at offset {base_offset} of {}-{}: \
                         {error}",
                        request.topic, request.partition
                    ))
                })? {
                    aborted_producers.remove(&producer_id);
                }
            } else if transactional && aborted_producers.contains(&producer_id) {
                next_fetch_offset = batch_next_offset;
                continue;
            }
        }
        if control {
            next_fetch_offset = batch_next_offset;
            continue;
        }
        let codec = (attributes & 0x07) as u8;
        let log_append_time = attributes & 0x08 != 0;
        let base_timestamp = read_i64(batch, 27);
        let max_timestamp = read_i64(batch, 35);
        let count = read_i32(batch, 57).max(0) as usize;
        let decompressed;
        let records: &[u8] = if codec == 0 {
            &batch[BATCH_HEADER_BYTES..]
        } else {
            decompressed = decompress(codec, &batch[BATCH_HEADER_BYTES..]).map_err(|error| {
                DecodeError::Corrupt(format!(
                    "cannot decompress the record batch at offset {base_offset} of {}-{}: {error}",
                    request.topic, request.partition
                ))
            })?;
            &decompressed
        };
        let mut cursor = Cursor::new(records);
        for _ in 0..count {
            let offset = read_record(
                &mut cursor,
                &mut columns,
                request,
                base_offset,
                if log_append_time { Some(max_timestamp) } else { None },
                base_timestamp,
                log_append_time,
            )
            .map_err(|error| match error {
                RecordError::Malformed(reason) => DecodeError::Corrupt(format!(
                    "malformed record in the batch at offset {base_offset} of {}-{}: {reason}",
                    request.topic, request.partition
                )),
                RecordError::Timestamp { offset, millis } => DecodeError::TimestampOutOfRange(
                    timestamp_out_of_range(request.topic, request.partition, offset, millis),
                ),
            })?;
            if let Some(offset) = offset {
                next_fetch_offset = offset + 1;
            }
        }
        if cursor.position != records.len() {
            return Err(DecodeError::Corrupt(format!(
                "the record batch at offset {base_offset} of {}-{} has {} bytes after its {count} \
                 records",
                request.topic,
                request.partition,
                records.len() - cursor.position
            )));
        }
    }
    // As the Java consumer and kafka-python: the next fetch starts past the last batch read.
    if let Some(offset) = last_batch_next_offset {
        next_fetch_offset = offset;
    }
    Ok(Decoded { columns: finish(columns, request), next_fetch_offset, leader_epoch })
}

/// Whether a control batch is an abort marker, as the Java consumer reads it: an empty
/// batch (the log cleaner keeps them) is no marker; a first record without a key of at least
/// 4 bytes (version, type) or with a negative version is corrupt.
fn is_abort_marker(batch: &[u8]) -> Result<bool, String> {
    if read_i32(batch, 57) <= 0 {
        return Ok(false);
    }
    let key = record_key(&mut Cursor::new(&batch[BATCH_HEADER_BYTES..]))?;
    let key = key.ok_or("a control record without a key")?;
    if key.len() < 4 {
        return Err(format!("a control record key of {} bytes", key.len()));
    }
    let version = i16::from_be_bytes([key[0], key[1]]);
    if version < 0 {
        return Err(format!("a control record key of version {version}"));
    }
    Ok(i16::from_be_bytes([key[2], key[3]]) == 0)
}

/// The key of one record, the record parsed whole by the rules of `read_record`.
fn record_key<'a>(cursor: &mut Cursor<'a>) -> Result<Option<&'a [u8]>, String> {
    let length = cursor.varint()?;
    if length < 0 {
        return Err(format!("negative record length {length}"));
    }
    let start = cursor.position;
    let end = start + length as usize;
    if end > cursor.data.len() {
        return Err("truncated record".into());
    }
    cursor.bytes(1)?; // attributes
    cursor.varlong()?; // timestamp delta
    cursor.varint()?; // offset delta
    let key = cursor.nullable_bytes()?;
    cursor.nullable_bytes()?; // value
    let header_count = cursor.varint()?;
    if header_count < 0 {
        return Err(format!("invalid number of record headers {header_count}"));
    }
    for _ in 0..header_count {
        cursor.nullable_bytes()?.ok_or("a header key is null")?;
        cursor.nullable_bytes()?;
    }
    if cursor.position != end {
        return Err(format!(
            "invalid record size: {length} bytes, but its fields take {}",
            cursor.position - start
        ));
    }
    Ok(key)
}

/// Appends one record unless it lies below the fetch offset; returns its offset when kept.
/// Every record is parsed whole, kept or not, as the Java consumer and kafka-python do:
/// every field, headers included, within the record's length, which must be used exactly.
fn read_record(
    cursor: &mut Cursor,
    columns: &mut Columns,
    request: &DecodeRequest,
    base_offset: i64,
    fixed_timestamp: Option<i64>,
    base_timestamp: i64,
    log_append_time: bool,
) -> Result<Option<i64>, RecordError> {
    let length = cursor.varint()?;
    if length < 0 {
        return Err(format!("negative record length {length}").into());
    }
    let start = cursor.position;
    let end = start + length as usize;
    if end > cursor.data.len() {
        return Err("truncated record".into());
    }
    cursor.bytes(1)?; // attributes
    let timestamp_delta = cursor.varlong()?;
    let offset_delta = cursor.varint()?;
    let key = cursor.nullable_bytes()?;
    let value = cursor.nullable_bytes()?;
    let header_count = cursor.varint()?;
    if header_count < 0 {
        return Err(format!("invalid number of record headers {header_count}").into());
    }
    let offset = base_offset
        .checked_add(offset_delta as i64)
        .filter(|offset| *offset < i64::MAX)
        .ok_or("its offset is beyond the largest offset Kafka can hold")?;
    let keep = offset >= request.fetch_offset;
    let collect = keep && request.include_headers;
    for _ in 0..header_count {
        let header_key = cursor.nullable_bytes()?.ok_or("a header key is null")?;
        let header_value = cursor.nullable_bytes()?;
        if collect {
            // As Spark's own source (Java's String of UTF-8): malformed bytes become U+FFFD.
            columns.header_keys.append_value(String::from_utf8_lossy(header_key));
            columns.header_values.append_option(header_value);
        }
    }
    if cursor.position != end {
        return Err(format!(
            "invalid record size: {length} bytes, but its fields take {}",
            cursor.position - start
        )
        .into());
    }
    if !keep {
        return Ok(None);
    }
    let millis = match fixed_timestamp {
        Some(fixed) => fixed as i128,
        None => base_timestamp as i128 + timestamp_delta as i128,
    };
    let micros = i64::try_from(millis)
        .ok()
        .and_then(|millis| millis.checked_mul(1000))
        .ok_or(RecordError::Timestamp { offset, millis })?;
    if collect {
        columns.header_offsets.push(columns.header_keys.len() as i32);
        columns.header_valid.append(header_count > 0);
    }
    columns.keys.append_option(key);
    columns.values.append_option(value);
    columns.offsets.append_value(offset);
    columns.timestamps.push(micros);
    columns.timestamp_types.append_value(log_append_time as i32);
    Ok(Some(offset))
}

fn finish(mut columns: Columns, request: &DecodeRequest) -> StructArray {
    let rows = columns.offsets.len();
    let topic = StringArray::from_iter_values(std::iter::repeat_n(request.topic, rows));
    let mut fields = vec![
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new("topic", DataType::Utf8, true),
        Field::new("partition", DataType::Int32, true),
        Field::new("offset", DataType::Int64, true),
        Field::new("timestamp", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
        Field::new("timestampType", DataType::Int32, true),
    ];
    let mut arrays: Vec<ArrayRef> = vec![
        Arc::new(columns.keys.finish()),
        Arc::new(columns.values.finish()),
        Arc::new(topic),
        Arc::new(Int32Array::from(vec![request.partition; rows])),
        Arc::new(columns.offsets.finish()),
        Arc::new(
            TimestampMicrosecondArray::new(ScalarBuffer::from(columns.timestamps), None).with_timezone("UTC"),
        ),
        Arc::new(columns.timestamp_types.finish()),
    ];
    if request.include_headers {
        let items = StructArray::new(
            header_fields(),
            vec![Arc::new(columns.header_keys.finish()), Arc::new(columns.header_values.finish())],
            None,
        );
        let valid = NullBuffer::new(columns.header_valid.finish());
        let DataType::List(item_field) = headers_type() else { unreachable!() };
        let headers = ListArray::new(
            item_field,
            OffsetBuffer::new(ScalarBuffer::from(columns.header_offsets)),
            Arc::new(items),
            Some(valid),
        );
        fields.push(Field::new("headers", headers.data_type().clone(), true));
        arrays.push(Arc::new(headers));
    }
    StructArray::new(Fields::from(fields), arrays, None)
}
