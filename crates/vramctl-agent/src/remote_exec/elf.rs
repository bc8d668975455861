//! A Python's version read from its ELF file, never by running it: the `Py_Version` symbol
//! (`const unsigned long Py_Version = PY_VERSION_HEX`, exported by every CPython since 3.11
//! from the executable or from `libpython3.X.so`) looked up in the dynamic symbol table and
//! its value read from the file.
//!
//! The file is another user's: every offset and length is checked against the file's size
//! and bounded ([`MAX_TABLE_BYTES`]), reads are positioned (`pread`), and what is read is
//! only ever a number. The number is a hint, not a proof: it chooses which root-owned helper
//! interpreter is tried, and that helper runs with the target's own credentials, so a file
//! that lies about its version gains its owner nothing.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// The most bytes read for one table (section headers, `.dynsym`, `.dynstr`): libpython's
/// `.dynsym` and `.dynstr` are under 1 MiB each.
pub const MAX_TABLE_BYTES: u64 = 16 << 20;
/// Section header type of the dynamic symbol table.
const SHT_DYNSYM: u32 = 11;
/// Section header type of a section with no bytes in the file (`.bss`).
const SHT_NOBITS: u32 = 8;
/// The symbol looked for, with the NUL that ends it in the string table.
const SYMBOL: &[u8] = b"Py_Version\0";

/// `Py_Version` as found in a file: the version and where its bytes are (for tools and
/// tests that check or change it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyVersion {
    /// `PY_VERSION_HEX`: `0x030E00F0` is 3.14.0 final.
    pub hex: u32,
    /// Where its value starts in the file.
    pub file_offset: u64,
    /// How many bytes it has (8 on 64-bit systems: an `unsigned long`).
    pub size: u64,
    /// The file is big-endian.
    pub big_endian: bool,
}

impl PyVersion {
    /// `(major, minor)`.
    pub fn major_minor(&self) -> (u32, u32) {
        ((self.hex >> 24) & 0xff, (self.hex >> 16) & 0xff)
    }
}

/// Positioned, bounded reads of one ELF file of either class and byte order.
struct Reader<'a> {
    file: &'a File,
    len: u64,
    wide: bool,
    big_endian: bool,
}

impl Reader<'_> {
    fn bytes(&self, offset: u64, count: u64) -> Option<Vec<u8>> {
        if count > MAX_TABLE_BYTES || offset.checked_add(count)? > self.len {
            return None;
        }
        let mut buf = vec![0; usize::try_from(count).ok()?];
        self.file.read_exact_at(&mut buf, offset).ok()?;
        Some(buf)
    }

    /// An unsigned integer of `size` (1, 2, 4 or 8) bytes at `at` in `buf`.
    fn uint(&self, buf: &[u8], at: usize, size: usize) -> Option<u64> {
        let raw = buf.get(at..at.checked_add(size)?)?;
        let mut value = 0u64;
        if self.big_endian {
            for &b in raw {
                value = (value << 8) | u64::from(b);
            }
        } else {
            for &b in raw.iter().rev() {
                value = (value << 8) | u64::from(b);
            }
        }
        Some(value)
    }

    /// An address-sized field (4 bytes in ELF32, 8 in ELF64).
    fn addr(&self, buf: &[u8], at32: usize, at64: usize) -> Option<u64> {
        if self.wide {
            self.uint(buf, at64, 8)
        } else {
            self.uint(buf, at32, 4)
        }
    }
}

/// One section header's fields that matter here.
#[derive(Clone, Copy)]
struct Section {
    kind: u32,
    addr: u64,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

/// `Py_Version` of the ELF `file`, or `None` when it is not an ELF file, has no such symbol
/// (not Python, or a Python before 3.11), or anything in it is out of bounds.
pub fn py_version(file: &File) -> Option<PyVersion> {
    let len = file.metadata().ok()?.len();
    let mut ident = [0u8; 16];
    file.read_exact_at(&mut ident, 0).ok()?;
    if ident[..4] != *b"\x7fELF" {
        return None;
    }
    let r = Reader {
        file,
        len,
        wide: match ident[4] {
            1 => false,
            2 => true,
            _ => return None,
        },
        big_endian: match ident[5] {
            1 => false,
            2 => true,
            _ => return None,
        },
    };
    let header = r.bytes(0, if r.wide { 64 } else { 52 })?;
    let shoff = r.addr(&header, 0x20, 0x28)?;
    let (shentsize, shnum_at) = if r.wide { (0x3a, 0x3c) } else { (0x2e, 0x30) };
    let shentsize = r.uint(&header, shentsize, 2)?;
    let mut shnum = r.uint(&header, shnum_at, 2)?;
    if shoff == 0 || shentsize < if r.wide { 64 } else { 40 } {
        return None;
    }
    if shnum == 0 {
        // More than 0xff00 sections: the count is section 0's size.
        let first = r.bytes(shoff, shentsize)?;
        shnum = r.addr(&first, 0x14, 0x20)?;
    }
    let table = r.bytes(shoff, shnum.checked_mul(shentsize)?)?;
    let section = |index: u64| -> Option<Section> {
        let at = usize::try_from(index.checked_mul(shentsize)?).ok()?;
        let h = table.get(at..at.checked_add(usize::try_from(shentsize).ok()?)?)?;
        Some(Section {
            kind: u32::try_from(r.uint(h, 4, 4)?).ok()?,
            addr: r.addr(h, 0x0c, 0x10)?,
            offset: r.addr(h, 0x10, 0x18)?,
            size: r.addr(h, 0x14, 0x20)?,
            link: u32::try_from(r.uint(h, if r.wide { 0x28 } else { 0x18 }, 4)?).ok()?,
            entsize: r.addr(h, 0x24, 0x38)?,
        })
    };
    let dynsym = (0..shnum)
        .filter_map(section)
        .find(|s| s.kind == SHT_DYNSYM)?;
    let strtab = section(u64::from(dynsym.link))?;
    let strings = r.bytes(strtab.offset, strtab.size)?;
    let symbols = r.bytes(dynsym.offset, dynsym.size)?;
    let entsize = usize::try_from(dynsym.entsize).ok()?;
    if entsize < if r.wide { 24 } else { 16 } {
        return None;
    }
    for sym in symbols.chunks_exact(entsize) {
        let name = usize::try_from(r.uint(sym, 0, 4)?).ok()?;
        if strings.get(name..name.saturating_add(SYMBOL.len())) != Some(SYMBOL) {
            continue;
        }
        // Elf64_Sym: name, info, other, shndx, value, size; Elf32_Sym: name, value, size,
        // info, other, shndx.
        let (value, size, shndx) = if r.wide {
            (r.uint(sym, 8, 8)?, r.uint(sym, 16, 8)?, r.uint(sym, 6, 2)?)
        } else {
            (r.uint(sym, 4, 4)?, r.uint(sym, 8, 4)?, r.uint(sym, 14, 2)?)
        };
        let home = section(shndx)?;
        if home.kind == SHT_NOBITS || !(4..=8).contains(&size) {
            return None;
        }
        let within = value.checked_sub(home.addr)?;
        if within.checked_add(size)? > home.size {
            return None;
        }
        let file_offset = home.offset.checked_add(within)?;
        let bytes = r.bytes(file_offset, size)?;
        let raw = r.uint(&bytes, 0, usize::try_from(size).ok()?)?;
        // PY_VERSION_HEX fits 32 bits; an `unsigned long` holds it in its low half.
        let hex = u32::try_from(raw).ok()?;
        return Some(PyVersion {
            hex,
            file_offset,
            size,
            big_endian: r.big_endian,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A little 64-bit ELF file with a `.dynsym` holding `Py_Version` in `.rodata`.
    fn elf64(version: u64, big_endian: bool) -> Vec<u8> {
        let put = |buf: &mut Vec<u8>, v: u64, size: usize| {
            let bytes = v.to_le_bytes();
            let mut b = bytes[..size].to_vec();
            if big_endian {
                b.reverse();
            }
            buf.extend_from_slice(&b);
        };
        let strings = b"\0Py_Versio\0Py_Version\0".to_vec();
        let rodata_addr = 0x4000u64;
        // Layout: header (64), strings at 64, rodata at 96 (8 bytes), dynsym at 104 (3 * 24),
        // section headers at 176 (5 * 64).
        let mut f = Vec::new();
        f.extend_from_slice(b"\x7fELF");
        f.push(2);
        f.push(if big_endian { 2 } else { 1 });
        f.push(1);
        f.extend_from_slice(&[0; 9]);
        put(&mut f, 3, 2); // e_type
        put(&mut f, 62, 2); // e_machine
        put(&mut f, 1, 4); // e_version
        put(&mut f, 0, 8); // e_entry
        put(&mut f, 0, 8); // e_phoff
        put(&mut f, 176, 8); // e_shoff
        put(&mut f, 0, 4); // e_flags
        put(&mut f, 64, 2); // e_ehsize
        put(&mut f, 56, 2); // e_phentsize
        put(&mut f, 0, 2); // e_phnum
        put(&mut f, 64, 2); // e_shentsize
        put(&mut f, 5, 2); // e_shnum
        put(&mut f, 0, 2); // e_shstrndx
        assert_eq!(f.len(), 64);
        f.extend_from_slice(&strings);
        f.resize(96, 0);
        put(&mut f, version, 8);
        let sym = |f: &mut Vec<u8>, name: u64, value: u64, shndx: u64| {
            put(f, name, 4);
            f.push(0x11);
            f.push(0);
            put(f, shndx, 2);
            put(f, value, 8);
            put(f, 8, 8);
        };
        sym(&mut f, 0, 0, 0);
        // A name that only starts like it.
        sym(&mut f, 1, rodata_addr, 3);
        sym(&mut f, 11, rodata_addr, 3);
        assert_eq!(f.len(), 176);
        let section = |f: &mut Vec<u8>,
                       kind: u64,
                       addr: u64,
                       offset: u64,
                       size: u64,
                       link: u64,
                       entsize: u64| {
            put(f, 0, 4);
            put(f, kind, 4);
            put(f, 0, 8);
            put(f, addr, 8);
            put(f, offset, 8);
            put(f, size, 8);
            put(f, link, 4);
            put(f, 0, 4);
            put(f, 8, 8);
            put(f, entsize, 8);
        };
        section(&mut f, 0, 0, 0, 0, 0, 0);
        section(&mut f, 11, 0, 104, 72, 2, 24);
        section(&mut f, 3, 0, 64, strings.len() as u64, 0, 0);
        section(&mut f, 1, rodata_addr, 96, 8, 0, 0);
        section(&mut f, 8, 0x8000, 0, 64, 0, 0);
        f
    }

    fn file_of(bytes: &[u8]) -> (tempfile::NamedTempFile, File) {
        let mut tmp = tempfile::NamedTempFile::new().expect("temp file");
        tmp.write_all(bytes).expect("write");
        let file = File::open(tmp.path()).expect("open");
        (tmp, file)
    }

    #[test]
    fn py_version_is_read_from_the_dynamic_symbol_table_in_either_byte_order() {
        for big_endian in [false, true] {
            let (_tmp, file) = file_of(&elf64(0x030E_00F0, big_endian));
            let v = py_version(&file).expect("found");
            assert_eq!(v.major_minor(), (3, 14));
            assert_eq!(v.hex, 0x030E_00F0);
            assert_eq!((v.file_offset, v.size, v.big_endian), (96, 8, big_endian));
        }
    }

    #[test]
    fn a_damaged_or_foreign_file_has_no_version() {
        let good = elf64(0x030E_00F0, false);
        for (what, bytes) in [
            ("empty", Vec::new()),
            ("text", b"#!/bin/sh\necho 3.14\n".to_vec()),
            ("truncated", good[..150].to_vec()),
            ("section headers past the end", {
                let mut b = good.clone();
                b[0x28] = 0xf0;
                b
            }),
            ("a huge table", {
                let mut b = good.clone();
                // .dynsym's size: 2^40 bytes.
                b[176 + 64 + 0x20 + 5] = 1;
                b
            }),
        ] {
            let (_tmp, file) = file_of(&bytes);
            assert_eq!(py_version(&file), None, "{what}");
        }
    }

    #[test]
    fn this_machines_python_says_its_own_version() {
        // The interpreter that runs `python3` here, or the libpython it loads.
        let Ok(out) = std::process::Command::new("python3")
            .args(["-c", "import sys, sysconfig; print(sys.version_info[0], sys.version_info[1], sys.executable, (sysconfig.get_config_var('LIBDIR') or '') + '/' + (sysconfig.get_config_var('INSTSONAME') or ''))"])
            .output()
        else {
            eprintln!("SKIPPED: no python3 here");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let words: Vec<&str> = text.split_whitespace().collect();
        let [major, minor, exe, lib] = words[..] else {
            eprintln!("SKIPPED: python3 said {text:?}");
            return;
        };
        let expected: (u32, u32) = (major.parse().expect("major"), minor.parse().expect("minor"));
        if expected < (3, 11) {
            eprintln!("SKIPPED: python3 is {expected:?}, before Py_Version");
            return;
        }
        let found = [exe, lib]
            .iter()
            .filter_map(|p| File::open(p).ok())
            .find_map(|f| py_version(&f))
            .expect("Py_Version in the executable or its libpython");
        assert_eq!(found.major_minor(), expected);
    }
}
