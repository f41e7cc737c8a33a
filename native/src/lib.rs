//! eospack's native Kafka data path: record batches (format v2) into Arrow and back.
//!
//! Python reaches it as `eospack._native`; `connectors/kafka/records/record_batches.py` is the
//! only caller and holds the pure-Python reference path it is tested against. Arrow data
//! crosses the boundary through the Arrow C data interface (PyCapsules), without a copy.

mod codec;
mod decode;
mod encode;

use std::ffi::CString;
use std::sync::Arc;

use arrow_array::ffi::{from_ffi, to_ffi, FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::{make_array, Array, StructArray};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyCapsule, PyTuple};

fn export(py: Python<'_>, array: StructArray) -> PyResult<(Py<PyCapsule>, Py<PyCapsule>)> {
    let (ffi_array, ffi_schema) =
        to_ffi(&array.into_data()).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let schema = PyCapsule::new(py, ffi_schema, Some(CString::new("arrow_schema").unwrap()))?;
    let array = PyCapsule::new(py, ffi_array, Some(CString::new("arrow_array").unwrap()))?;
    Ok((schema.unbind(), array.unbind()))
}

fn import(schema: &Bound<'_, PyCapsule>, array: &Bound<'_, PyCapsule>) -> PyResult<StructArray> {
    let schema_pointer = schema.pointer_checked(Some(c"arrow_schema"))?.cast::<FFI_ArrowSchema>().as_ptr();
    let array_pointer = array.pointer_checked(Some(c"arrow_array"))?.cast::<FFI_ArrowArray>().as_ptr();
    // SAFETY: the capsules come from pyarrow's __arrow_c_array__; the array is moved out
    // (its release callback is taken over), the schema only borrowed.
    let data = unsafe {
        let ffi_array = FFI_ArrowArray::from_raw(array_pointer);
        from_ffi(ffi_array, &*schema_pointer)
    }
    .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let array = make_array(data);
    encode::as_struct(&array).cloned().map_err(PyTypeError::new_err)
}

/// Decode the record data of one partition of a Fetch response. Returns
/// (schema capsule, array capsule, next fetch offset, leader epoch), or None when the data
/// holds a legacy message set (magic 0 or 1), which the reference path decodes. Raises
/// ValueError on corrupt data, OverflowError on a record timestamp out of Spark's range.
#[pyfunction]
#[pyo3(signature = (raw, fetch_offset, topic, partition, read_committed, aborted, include_headers, check_crcs=true))]
#[allow(clippy::too_many_arguments)]
fn decode_records(
    py: Python<'_>,
    raw: &Bound<'_, PyBytes>,
    fetch_offset: i64,
    topic: &str,
    partition: i32,
    read_committed: bool,
    aborted: Vec<(i64, i64)>,
    include_headers: bool,
    check_crcs: bool,
) -> PyResult<Option<Py<PyTuple>>> {
    let request = decode::DecodeRequest {
        raw: raw.as_bytes(),
        fetch_offset,
        topic,
        partition,
        read_committed,
        aborted,
        include_headers,
        check_crcs,
    };
    let result = py.detach(|| decode::decode(&request));
    match result {
        Ok(decoded) => {
            let (schema, array) = export(py, decoded.columns)?;
            let tuple = (schema, array, decoded.next_fetch_offset, decoded.leader_epoch);
            Ok(Some(tuple.into_pyobject(py)?.unbind()))
        }
        Err(decode::DecodeError::Legacy) => Ok(None),
        Err(decode::DecodeError::Corrupt(message)) => Err(PyValueError::new_err(message)),
        Err(decode::DecodeError::TimestampOutOfRange(message)) => Err(PyOverflowError::new_err(message)),
    }
}

/// Encode rows (a record batch's capsules with Spark's Kafka sink columns key, value,
/// partition, headers; each optional but value) into record batches of at most
/// `max_batch_bytes` uncompressed (one record may exceed it alone). Rows without partition
/// or key go to `sticky_partition`, the next partition once its batch is full. Returns
/// ([(partition, record count, bytearray)], the sticky partition to continue with).
#[pyfunction]
#[pyo3(signature = (schema, array, partitions, sticky_partition, max_batch_bytes, max_record_bytes, timestamp_ms, codec))]
#[allow(clippy::too_many_arguments)]
fn encode_records(
    py: Python<'_>,
    schema: &Bound<'_, PyCapsule>,
    array: &Bound<'_, PyCapsule>,
    partitions: i32,
    sticky_partition: i32,
    max_batch_bytes: usize,
    max_record_bytes: usize,
    timestamp_ms: i64,
    codec: u8,
) -> PyResult<(Vec<(i32, i32, Py<PyByteArray>)>, i32)> {
    let rows = Arc::new(import(schema, array)?);
    let request = encode::EncodeRequest {
        rows: &rows,
        partitions,
        sticky_partition,
        max_batch_bytes,
        max_record_bytes,
        timestamp_ms,
        codec,
    };
    let (batches, sticky) = py.detach(|| encode::encode(&request)).map_err(PyValueError::new_err)?;
    let batches = batches
        .into_iter()
        .map(|batch| (batch.partition, batch.records, PyByteArray::new(py, &batch.bytes).unbind()))
        .collect();
    Ok((batches, sticky))
}

/// Stamp producer id, epoch, base sequence and the transactional bit into an encoded
/// batch (in place) and recompute its CRC.
#[pyfunction]
fn set_producer_state(
    batch: &Bound<'_, PyByteArray>,
    producer_id: i64,
    epoch: i16,
    base_sequence: i32,
    transactional: bool,
) -> PyResult<()> {
    // SAFETY: no Python code runs while the slice is alive.
    let bytes = unsafe { batch.as_bytes_mut() };
    encode::set_producer_state(bytes, producer_id, epoch, base_sequence, transactional)
        .map_err(PyValueError::new_err)
}

/// How this extension was compiled: "release" (optimised, what every install builds) or
/// "debug" (debug assertions on, reads Kafka 1.3-1.7x slower). `eospack doctor` prints it.
#[pyfunction]
fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Kafka's default partition of a key (murmur2, as the Java client computes it).
#[pyfunction]
fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    encode::partition_for_key(key, partitions)
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(decode_records, module)?)?;
    module.add_function(wrap_pyfunction!(encode_records, module)?)?;
    module.add_function(wrap_pyfunction!(set_producer_state, module)?)?;
    module.add_function(wrap_pyfunction!(partition_for_key, module)?)?;
    module.add_function(wrap_pyfunction!(build_profile, module)?)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
