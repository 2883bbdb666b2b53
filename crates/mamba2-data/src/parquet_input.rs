//! Parquet files as tables: flat schemas of numeric columns and an optional timestamp (or
//! date, or date-string) column, read with the `parquet` crate's column readers (no Arrow).
//!
//! Each column is read as its physical type and mapped by its logical type: integers and
//! floats (and decimals, scaled) are numbers, `TIMESTAMP` (milli-, micro- or nanoseconds),
//! `DATE` and legacy INT96 are times, strings are text (a date column written as text still
//! reads as dates). Nulls are empty cells. Nested or repeated columns are refused by name.
//! pandas' unnamed index (`__index_level_0__`) is not a feature and is left out.

use bytes::Bytes;
use parquet::basic::{LogicalType, TimeUnit, Type as Physical};
use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::DataType;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::ColumnDescriptor;

use crate::cell::Cell;
use crate::DataError;

/// Values decoded per call; a column chunk is read in such batches.
const BATCH: usize = 8192;

/// The column names and the cells, column by column, of the Parquet file `bytes` (`origin` names
/// it in errors); the table's own checks are the caller's.
pub(crate) fn read(bytes: Vec<u8>, origin: &str) -> Result<(Vec<String>, Vec<Vec<Cell>>), DataError> {
    // The reader asserts on some damaged metadata (e.g. a negative column offset) rather than
    // returning an error.
    mamba2_cpu::catch_panic(|| read_unguarded(bytes, origin))
        .map_err(|why| DataError::Data { origin: origin.to_string(), why: format!("not a readable Parquet file: {why}") })?
}

fn read_unguarded(bytes: Vec<u8>, origin: &str) -> Result<(Vec<String>, Vec<Vec<Cell>>), DataError> {
    let err = |why: String| DataError::Data { origin: origin.to_string(), why };
    let reader = SerializedFileReader::new(Bytes::from(bytes)).map_err(|e| err(format!("not a readable Parquet file: {e}")))?;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let mut header = Vec::new();
    let mut keep = Vec::new();
    for (i, col) in schema.columns().iter().enumerate() {
        let path = col.path().string();
        if col.path().parts().len() != 1 || col.max_rep_level() > 0 {
            return Err(err(format!("column `{path}` is nested or repeated; only flat tables of numbers and times are read")));
        }
        if path.starts_with("__index_level_") {
            continue;
        }
        header.push(path);
        keep.push(i);
    }
    if header.is_empty() {
        return Err(err("no columns".into()));
    }
    // Column-major cells of every row group (the table's checks read them row by row).
    let mut columns: Vec<Vec<Cell>> = vec![Vec::new(); keep.len()];
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).map_err(|e| err(format!("row group {g}: {e}")))?;
        let rows = usize::try_from(group.metadata().num_rows()).map_err(|_| err(format!("row group {g}: a negative row count")))?;
        for (k, &i) in keep.iter().enumerate() {
            let descr = schema.column(i);
            let name = &header[k];
            let col = group.get_column_reader(i).map_err(|e| err(format!("column `{name}`: {e}")))?;
            let cells = read_column(col, &descr).map_err(|why| err(format!("column `{name}`: {why}")))?;
            if cells.len() != rows {
                return Err(err(format!("column `{name}`: {} values in row group {g} of {rows} rows", cells.len())));
            }
            columns[k].extend(cells);
        }
    }
    Ok((header, columns))
}

/// Every value of one column chunk, nulls as [`Cell::Null`].
fn read_column(col: ColumnReader, descr: &ColumnDescriptor) -> Result<Vec<Cell>, String> {
    let logical = descr.logical_type_ref().cloned();
    let scale = match (&logical, descr.converted_type()) {
        (Some(LogicalType::Decimal(d)), _) => Some(d.scale),
        (None, parquet::basic::ConvertedType::DECIMAL) => Some(descr.type_scale()),
        _ => None,
    };
    let decimal = |v: f64| scale.map_or(v, |s| v / 10f64.powi(s));
    let max_def = descr.max_def_level();
    let cells = match col {
        ColumnReader::BoolColumnReader(r) => all(r, max_def, |v| Cell::Number(f64::from(u8::from(v))))?,
        ColumnReader::Int32ColumnReader(r) => match logical {
            Some(LogicalType::Date) => all(r, max_def, |d| Cell::Time(i64::from(d) * 86_400))?,
            _ => all(r, max_def, |v| Cell::Number(decimal(f64::from(v))))?,
        },
        ColumnReader::Int64ColumnReader(r) => {
            let per_second = match (&logical, descr.converted_type()) {
                (Some(LogicalType::Timestamp(t)), _) => Some(match t.unit {
                    TimeUnit::MILLIS => 1_000,
                    TimeUnit::MICROS => 1_000_000,
                    TimeUnit::NANOS => 1_000_000_000,
                }),
                (None, parquet::basic::ConvertedType::TIMESTAMP_MILLIS) => Some(1_000),
                (None, parquet::basic::ConvertedType::TIMESTAMP_MICROS) => Some(1_000_000),
                _ => None,
            };
            match per_second {
                Some(p) => all(r, max_def, |v: i64| Cell::Time(v.div_euclid(p)))?,
                None => all(r, max_def, |v| Cell::Number(decimal(v as f64)))?,
            }
        }
        ColumnReader::Int96ColumnReader(r) => all(r, max_def, |v| Cell::Time(v.to_seconds()))?,
        ColumnReader::FloatColumnReader(r) => all(r, max_def, |v| Cell::Number(f64::from(v)))?,
        ColumnReader::DoubleColumnReader(r) => all(r, max_def, Cell::Number)?,
        ColumnReader::ByteArrayColumnReader(r) => {
            if scale.is_some() {
                return Err("decimals stored as byte arrays are not read; store the column as a float".into());
            }
            all(r, max_def, |v| Cell::Text(String::from_utf8_lossy(v.data()).into_owned()))?
        }
        ColumnReader::FixedLenByteArrayColumnReader(r) => match scale {
            Some(_) if descr.type_length() <= 16 => all(r, max_def, |v| {
                // A big-endian two's complement integer, sign-extended to 128 bits.
                let b = v.data();
                let fill = if b.first().is_some_and(|x| x & 0x80 != 0) { 0xff } else { 0 };
                let mut wide = [fill; 16];
                wide[16 - b.len()..].copy_from_slice(b);
                Cell::Number(decimal(i128::from_be_bytes(wide) as f64))
            })?,
            _ if descr.physical_type() == Physical::FIXED_LEN_BYTE_ARRAY && matches!(logical, Some(LogicalType::Float16)) => {
                all(r, max_def, |v| {
                    let b = v.data();
                    Cell::Number(if b.len() == 2 { f64::from(half::f16::from_le_bytes([b[0], b[1]])) } else { f64::NAN })
                })?
            }
            _ => all(r, max_def, |v| Cell::Text(String::from_utf8_lossy(v.data()).into_owned()))?,
        },
    };
    Ok(cells)
}

/// Reads a whole column chunk with `reader`, mapping each value with `f` and each null (a
/// definition level under `max_def`) to [`Cell::Null`].
fn all<T: DataType>(mut reader: ColumnReaderImpl<T>, max_def: i16, f: impl Fn(T::T) -> Cell) -> Result<Vec<Cell>, String>
where
    T::T: Clone,
{
    let mut out = Vec::new();
    loop {
        let (mut values, mut defs) = (Vec::new(), Vec::new());
        let (records, read, levels) =
            reader.read_records(BATCH, if max_def > 0 { Some(&mut defs) } else { None }, None, &mut values).map_err(|e| e.to_string())?;
        if records == 0 {
            return Ok(out);
        }
        if max_def == 0 {
            out.extend(values.into_iter().take(read).map(&f));
            continue;
        }
        let mut values = values.into_iter().take(read);
        for &d in defs.iter().take(levels) {
            out.push(if d == max_def { values.next().map(&f).ok_or("fewer values than its levels say")? } else { Cell::Null });
        }
    }
}
