//! CSV records written one at a time to whatever `Write` a caller has at hand (`history
//! --format csv`, `history --audit --format csv`), through the store's one CSV writer
//! (`vramctl_store::format::csv_writer`), so quoting is the same everywhere.

use std::io::Write;

use anyhow::Context;

/// The store's CSV writer (`format::csv_writer`) over a buffer of one record, so that
/// sinks writing to a `&mut dyn Write` given per call use it too.
pub struct CsvRecord {
    writer: csv::Writer<RecordBuf>,
    buf: std::rc::Rc<std::cell::RefCell<Vec<u8>>>,
}

#[derive(Clone)]
struct RecordBuf(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

impl Write for RecordBuf {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Default for CsvRecord {
    fn default() -> Self {
        Self::new()
    }
}

impl CsvRecord {
    /// An empty record buffer.
    pub fn new() -> Self {
        let buf = std::rc::Rc::new(std::cell::RefCell::new(Vec::with_capacity(512)));
        Self {
            writer: vramctl_store::format::csv_writer(RecordBuf(buf.clone())),
            buf,
        }
    }
}

/// Writes `fields` as one CSV record to `out`.
pub fn write_csv_record<I, T>(
    record: &mut CsvRecord,
    out: &mut dyn Write,
    fields: I,
) -> anyhow::Result<()>
where
    I: IntoIterator<Item = T>,
    T: AsRef<[u8]>,
{
    record
        .writer
        .write_record(fields)
        .context("cannot format a CSV record")?;
    record
        .writer
        .flush()
        .context("cannot format a CSV record")?;
    let mut buf = record.buf.borrow_mut();
    out.write_all(&buf).context("cannot write to stdout")?;
    buf.clear();
    Ok(())
}
