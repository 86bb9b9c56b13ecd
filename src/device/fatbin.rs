//! Structural check of an embedded CUDA fatbin before it reaches the driver.
//! The driver's own loader may crash on an empty or truncated image, so every
//! image is walked here first: outer header, then each entry's header and
//! bounds. Layout (little-endian):
//!
//! - outer header, 16 B: magic `0xBA55ED50` (u32), version (u16), header size
//!   (u16, 16), payload size (u64); entries fill the payload exactly;
//! - each entry: kind (u16; 1 = PTX, 2 = ELF cubin), version (u16), entry
//!   header size (u32), payload size (u64), …, SM arch (u32 at offset 28),
//!   then the payload. An uncompressed cubin payload is a 64-bit ELF for
//!   EM_CUDA whose section header table lies inside the payload.

/// FNV-1a 64 of an image; `build.rs` stores it in the registry so that any
/// later corruption of the embedded bytes is caught before the driver sees them.
pub fn checksum(bytes: &[u8]) -> u64 {
    crate::numerics::fnv1a64(bytes)
}

/// Checks a cubin's ELF header: 64-bit little-endian, machine EM_CUDA (190),
/// and a section header table inside the payload.
fn check_cubin(body: &[u8]) -> Result<(), String> {
    if body.len() < 64 || !body.starts_with(b"\x7fELF") {
        return Err("is not an ELF image".into());
    }
    if body.get(4..6) != Some(&[2, 1]) {
        return Err("is not a 64-bit little-endian ELF".into());
    }
    if u16_at(body, 18)? != 190 {
        return Err(format!(
            "has ELF machine {} instead of EM_CUDA (190)",
            u16_at(body, 18)?
        ));
    }
    let shoff = u64_at(body, 40)?;
    let (shentsize, shnum) = (u16_at(body, 58)? as u64, u16_at(body, 60)? as u64);
    if shentsize != 64
        || shoff
            .checked_add(shentsize * shnum)
            .is_none_or(|e| e > body.len() as u64)
    {
        return Err("has a section header table outside the image".into());
    }
    Ok(())
}

const MAGIC: u32 = 0xBA55_ED50;
const OUTER_HEADER: usize = 16;
const MIN_ENTRY_HEADER: usize = 32;

/// One entry of a fatbin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// 1 = PTX, 2 = cubin.
    pub kind: u16,
    /// SM version, e.g. 90 for sm_90a.
    pub arch: u32,
    pub payload_bytes: u64,
}

/// The `N` bytes at `at`, or the error of an image too short to hold them.
fn bytes_at<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], String> {
    at.checked_add(N)
        .and_then(|end| b.get(at..end))
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or_else(|| format!("is truncated: {N} bytes at byte {at} of {}", b.len()))
}
fn u16_at(b: &[u8], at: usize) -> Result<u16, String> {
    bytes_at(b, at).map(u16::from_le_bytes)
}
fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    bytes_at(b, at).map(u32::from_le_bytes)
}
fn u64_at(b: &[u8], at: usize) -> Result<u64, String> {
    bytes_at(b, at).map(u64::from_le_bytes)
}

/// Walks `image` and returns its entries, or a sentence saying what is wrong.
pub fn validate(image: &[u8]) -> Result<Vec<Entry>, String> {
    if image.len() < OUTER_HEADER {
        return Err(format!(
            "{} bytes is shorter than the 16-byte fatbin header",
            image.len()
        ));
    }
    if u32_at(image, 0)? != MAGIC {
        return Err(format!("bad magic {:#010x}", u32_at(image, 0)?));
    }
    let header = u16_at(image, 6)? as usize;
    let payload = u64_at(image, 8)?;
    if header != OUTER_HEADER {
        return Err(format!("unexpected header size {header}"));
    }
    let end = (header as u64)
        .checked_add(payload)
        .filter(|&e| e <= image.len() as u64)
        .and_then(|e| usize::try_from(e).ok())
        .ok_or_else(|| {
            format!(
                "truncated: header announces {payload} payload bytes, only {} present",
                image.len() - header
            )
        })?;
    let mut entries = Vec::new();
    let mut at = header;
    while at < end {
        if end - at < MIN_ENTRY_HEADER {
            return Err(format!("entry header at byte {at} runs past the payload"));
        }
        let kind = u16_at(image, at)?;
        let entry_header = u32_at(image, at + 4)? as usize;
        let size = u64_at(image, at + 8)?;
        let arch = u32_at(image, at + 28)?;
        if entry_header < MIN_ENTRY_HEADER {
            return Err(format!("entry at byte {at} has header size {entry_header}"));
        }
        let next = (at as u64)
            .checked_add(entry_header as u64)
            .and_then(|x| x.checked_add(size))
            .filter(|&n| n <= end as u64)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| format!("entry at byte {at} (sm_{arch}) runs past the payload"))?;
        if !matches!(kind, 1 | 2) {
            return Err(format!("entry at byte {at} has unknown kind {kind}"));
        }
        let compressed = u32_at(image, at + 16)? != 0;
        let body = image
            .get(at + entry_header..next)
            .ok_or_else(|| format!("entry at byte {at} has a header past its end"))?;
        if kind == 2 && !compressed {
            check_cubin(body)
                .map_err(|why| format!("cubin entry at byte {at} (sm_{arch}) {why}"))?;
        }
        entries.push(Entry {
            kind,
            arch,
            payload_bytes: size,
        });
        at = next;
    }
    if entries.is_empty() {
        return Err("the image holds no entries".into());
    }
    Ok(entries)
}
