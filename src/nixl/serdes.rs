//! NIXL's descriptor-list wire format (`nixlSerDes`), encode and decode.
//!
//! The C++ example publishes descriptor lists through the store as the bytes
//! `nixlXferDList::serialize()` writes (upstream `src/infra/serdes` and
//! `nixlDescList::serialize`); Python's `nixl_agent.get_serialized_descs`
//! pickles an object whose state is the same bytes. `nixl-sys`'s own
//! `XferDescList::serialize` is bincode, which no C++ or Python peer reads,
//! so this module speaks the real format.
//!
//! Layout (little-endian, `size_t` = 8 bytes). Every field is
//! `tag ‖ u64 length ‖ payload ‖ "|"`:
//!
//! ```text
//! "nixlSerDes|"
//! "nixlDList"  len=10  "nixlBDList"                 "|"
//! "t"          len=4   u32 mem_type                 "|"   DRAM=0 VRAM=1 BLK=2 OBJ=3 FILE=4
//! "n"          len=8   u64 count                    "|"
//! ""           len=24·count  count × {u64 addr, u64 len, u64 dev_id}  "|"   (absent when count = 0)
//! ```
//!
//! One VRAM descriptor encodes to 104 bytes. The byte-exact agreement with
//! the real library is pinned by `tests/serdes.rs`.

/// NIXL memory segment type (`nixl_mem_t`), as encoded on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MemType {
    /// Host memory.
    Dram = 0,
    /// GPU memory.
    Vram = 1,
    /// Block device.
    Blk = 2,
    /// Object store.
    Obj = 3,
    /// File.
    File = 4,
}

impl MemType {
    fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Dram,
            1 => Self::Vram,
            2 => Self::Blk,
            3 => Self::Obj,
            4 => Self::File,
            _ => return None,
        })
    }
}

impl From<MemType> for nixl_sys::MemType {
    fn from(m: MemType) -> Self {
        match m {
            MemType::Dram => nixl_sys::MemType::Dram,
            MemType::Vram => nixl_sys::MemType::Vram,
            MemType::Blk => nixl_sys::MemType::Block,
            MemType::Obj => nixl_sys::MemType::Object,
            MemType::File => nixl_sys::MemType::File,
        }
    }
}

/// One buffer: address (bytes, in the owner's address space), length in
/// bytes, device id (GPU ordinal for VRAM, 0 for DRAM).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Desc {
    pub addr: u64,
    pub len: u64,
    pub dev_id: u64,
}

impl Desc {
    /// The whole of a buffer NIXL can register (host or device memory).
    pub fn of(buf: &(impl nixl_sys::NixlDescriptor + ?Sized)) -> Self {
        Self {
            // SAFETY: only the address is read, never dereferenced.
            addr: unsafe { buf.as_ptr() } as u64,
            len: buf.size() as u64,
            dev_id: buf.device_id(),
        }
    }

    /// This buffer cut into `count` consecutive pieces of `len / count`
    /// bytes each (a remainder is left out): slots of one registration.
    pub fn split(self, count: u64) -> impl Iterator<Item = Desc> {
        let len = self.len / count.max(1);
        (0..count).map(move |i| Desc {
            addr: self.addr + i * len,
            len,
            ..self
        })
    }
}

/// A transfer descriptor list (`nixlXferDList`): a memory type and buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescList {
    pub mem_type: MemType,
    pub descs: Vec<Desc>,
}

/// Why bytes could not be decoded as a descriptor list.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SerdesError {
    #[error("not a nixlSerDes buffer (missing the \"nixlSerDes|\" header)")]
    BadHeader,
    #[error("truncated: field {field:?} needs {need} more bytes, {have} left")]
    Truncated {
        field: &'static str,
        need: u64,
        have: usize,
    },
    #[error("expected field tag {expected:?}")]
    BadTag { expected: &'static str },
    #[error("field {field:?} has length {len}, expected {expected}")]
    BadLength {
        field: &'static str,
        len: u64,
        expected: u64,
    },
    #[error("field {field:?} is not terminated by '|'")]
    MissingSeparator { field: &'static str },
    #[error("list kind {0:?} is not a transfer descriptor list (nixlBDList)")]
    UnsupportedKind(String),
    #[error("unknown memory type {0}")]
    BadMemType(u32),
    #[error("{0} trailing bytes after the list")]
    Trailing(usize),
}

const HEADER: &[u8] = b"nixlSerDes|";
const DESC_BYTES: u64 = 24;

impl DescList {
    /// A list of one memory type.
    pub fn new(mem_type: MemType, descs: Vec<Desc>) -> Self {
        Self { mem_type, descs }
    }

    /// Encodes as `nixlXferDList::serialize()` does.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(71 + 33 + self.descs.len() * 24);
        out.extend_from_slice(HEADER);
        field(&mut out, b"nixlDList", b"nixlBDList");
        field(&mut out, b"t", &(self.mem_type as u32).to_le_bytes());
        field(&mut out, b"n", &(self.descs.len() as u64).to_le_bytes());
        if !self.descs.is_empty() {
            let mut payload = Vec::with_capacity(self.descs.len() * 24);
            for d in &self.descs {
                payload.extend_from_slice(&d.addr.to_le_bytes());
                payload.extend_from_slice(&d.len.to_le_bytes());
                payload.extend_from_slice(&d.dev_id.to_le_bytes());
            }
            field(&mut out, b"", &payload);
        }
        out
    }

    /// Decodes bytes written by [`DescList::encode`] or by NIXL itself.
    ///
    /// Never panics and allocates at most about three times the input's
    /// size: every length is checked against the bytes actually present.
    pub fn decode(bytes: &[u8]) -> Result<Self, SerdesError> {
        let mut r = Reader { buf: bytes };
        if !r.buf.starts_with(HEADER) {
            return Err(SerdesError::BadHeader);
        }
        r.buf = &r.buf[HEADER.len()..];
        let kind = r.field("nixlDList")?;
        if kind != b"nixlBDList" {
            return Err(SerdesError::UnsupportedKind(
                String::from_utf8_lossy(kind).into_owned(),
            ));
        }
        let t = r.fixed::<4>("t")?;
        let raw_type = u32::from_le_bytes(t);
        let mem_type = MemType::from_u32(raw_type).ok_or(SerdesError::BadMemType(raw_type))?;
        let count = u64::from_le_bytes(r.fixed::<8>("n")?);
        let mut descs = Vec::new();
        if count > 0 {
            // Check before multiplying or allocating: count comes from the wire.
            let expected = count
                .checked_mul(DESC_BYTES)
                .ok_or(SerdesError::BadLength {
                    field: "",
                    len: u64::MAX,
                    expected: u64::MAX,
                })?;
            let payload = r.field("")?;
            if payload.len() as u64 != expected {
                return Err(SerdesError::BadLength {
                    field: "",
                    len: payload.len() as u64,
                    expected,
                });
            }
            descs.reserve(count as usize);
            for chunk in payload.chunks_exact(24) {
                let word =
                    |i: usize| u64::from_le_bytes(chunk[i * 8..i * 8 + 8].try_into().unwrap());
                descs.push(Desc {
                    addr: word(0),
                    len: word(1),
                    dev_id: word(2),
                });
            }
        }
        if !r.buf.is_empty() {
            return Err(SerdesError::Trailing(r.buf.len()));
        }
        Ok(Self { mem_type, descs })
    }

    /// The same list as an `nixl_sys::XferDescList`, for host-API transfers.
    pub fn to_xfer_dlist(&self) -> Result<nixl_sys::XferDescList<'static>, nixl_sys::NixlError> {
        let mut list = nixl_sys::XferDescList::new(self.mem_type.into())?;
        for d in &self.descs {
            list.add_desc(d.addr as usize, d.len as usize, d.dev_id);
        }
        Ok(list)
    }

    /// The same list as an `nixl_sys::RemoteDescList` whose every buffer is
    /// owned by `agent`, for preparing a remote memory view.
    pub fn to_remote_dlist(
        &self,
        agent: &str,
    ) -> Result<nixl_sys::RemoteDescList, nixl_sys::NixlError> {
        let mut list = nixl_sys::RemoteDescList::new(self.mem_type.into())?;
        for d in &self.descs {
            list.add_desc(&nixl_sys::RemoteDescriptor {
                addr: d.addr as usize,
                len: d.len as usize,
                dev_id: d.dev_id,
                remote_agent: Some(agent),
            })?;
        }
        Ok(list)
    }
}

fn field(out: &mut Vec<u8>, tag: &[u8], payload: &[u8]) {
    out.extend_from_slice(tag);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out.push(b'|');
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, field: &'static str, n: u64) -> Result<&'a [u8], SerdesError> {
        if (self.buf.len() as u64) < n {
            return Err(SerdesError::Truncated {
                field,
                need: n,
                have: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n as usize);
        self.buf = tail;
        Ok(head)
    }

    fn field(&mut self, tag: &'static str) -> Result<&'a [u8], SerdesError> {
        if !self.buf.starts_with(tag.as_bytes()) {
            return Err(SerdesError::BadTag { expected: tag });
        }
        self.buf = &self.buf[tag.len()..];
        let len = u64::from_le_bytes(self.take(tag, 8)?.try_into().unwrap());
        let payload = self.take(tag, len)?;
        if self
            .take(tag, 1)
            .map_err(|_| SerdesError::MissingSeparator { field: tag })?
            != b"|"
        {
            return Err(SerdesError::MissingSeparator { field: tag });
        }
        Ok(payload)
    }

    fn fixed<const N: usize>(&mut self, tag: &'static str) -> Result<[u8; N], SerdesError> {
        let payload = self.field(tag)?;
        payload.try_into().map_err(|_| SerdesError::BadLength {
            field: tag,
            len: payload.len() as u64,
            expected: N as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_vram_descriptor_is_104_bytes() {
        let l = DescList::new(
            MemType::Vram,
            vec![Desc {
                addr: 0x1000,
                len: 256,
                dev_id: 0,
            }],
        );
        let b = l.encode();
        assert_eq!(b.len(), 104);
        assert_eq!(DescList::decode(&b).unwrap(), l);
    }

    #[test]
    fn empty_list_has_no_payload_field() {
        let l = DescList::new(MemType::Dram, vec![]);
        assert_eq!(l.encode().len(), 71);
        assert_eq!(DescList::decode(&l.encode()).unwrap(), l);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let l = DescList::new(
            MemType::Vram,
            vec![
                Desc {
                    addr: 1,
                    len: 2,
                    dev_id: 3
                };
                3
            ],
        );
        let b = l.encode();
        for cut in 0..b.len() {
            assert!(
                DescList::decode(&b[..cut]).is_err(),
                "prefix of {cut} bytes decoded"
            );
        }
    }

    #[test]
    fn absurd_count_is_rejected_without_allocating() {
        let mut b = DescList::new(MemType::Vram, vec![]).encode();
        // Overwrite the count with u64::MAX / 2 and append a tiny payload.
        let n_at = b.len() - 9;
        b[n_at..n_at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        b.extend_from_slice(b"\x18\0\0\0\0\0\0\0");
        assert!(DescList::decode(&b).is_err());
    }
}
