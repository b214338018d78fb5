//! The one pattern for byte formats that come from outside: a typed view over a
//! byte buffer, with little-endian fields at fixed offsets.
//!
//! Every card (the connection card, the emulated and verbs fabrics' cards) is a
//! `Card<T: AsRef<[u8]>>` view with `new_checked`, which rejects every malformed
//! buffer with `InvalidData` naming the fault, field getters that cannot fail
//! afterwards, and an `emit` that writes a card through the same offsets. Each card
//! begins with its [`CardFormat`]: a magic that names the format, then a version
//! byte; [`CardFormat::check`] is the only code that checks those.
//!
//! ```
//! use rdma_channel::wire::{le, CardFormat};
//! const DEMO: CardFormat = CardFormat { name: "demo card", magic: b"DEMO", version: 3 };
//! let mut card = vec![0u8; DEMO.header_len() + 4];
//! DEMO.emit(&mut card);
//! le::set_u32(&mut card, DEMO.header_len(), 7);
//! DEMO.check(&card, card.len())?;
//! assert_eq!(le::u32(&card, 5), 7);
//! card[4] = 2;
//! let e = DEMO.check(&card, card.len()).unwrap_err();
//! assert!(e.to_string().starts_with("bad demo card: version 2, this build speaks 3"));
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fmt;
use std::io;

/// The identity of a card format: what starts every card of it.
#[derive(Clone, Copy, Debug)]
pub struct CardFormat {
    /// What the format is called in error messages ("verbs card").
    pub name: &'static str,
    /// The first bytes of every card.
    pub magic: &'static [u8],
    /// The byte after the magic; both ends must speak the same.
    pub version: u8,
}

impl CardFormat {
    /// Bytes of magic and version.
    pub const fn header_len(&self) -> usize {
        self.magic.len() + 1
    }

    /// An `InvalidData` error: `"bad {name}: {msg}"`.
    pub fn invalid(&self, msg: impl fmt::Display) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad {}: {msg}", self.name),
        )
    }

    /// True when `b` starts with this format's magic (whatever follows).
    pub fn is_magic_of(&self, b: &[u8]) -> bool {
        b.starts_with(self.magic)
    }

    /// Checks that `b` holds at least `min_len` bytes (and the header), the magic and
    /// the version.
    ///
    /// # Errors
    ///
    /// `InvalidData` naming the first fault.
    pub fn check(&self, b: &[u8], min_len: usize) -> io::Result<()> {
        if !self.is_magic_of(b) {
            return Err(self.invalid(format_args!(
                "does not start with the magic {:?} (is the peer using the same fabric?)",
                String::from_utf8_lossy(self.magic)
            )));
        }
        let min_len = min_len.max(self.header_len());
        if b.len() < min_len {
            return Err(self.invalid(format_args!(
                "{} bytes, a card has at least {min_len}",
                b.len()
            )));
        }
        let v = b[self.magic.len()];
        if v != self.version {
            return Err(self.invalid(format_args!(
                "version {v}, this build speaks {} (both ends must run the same rdma-channel)",
                self.version
            )));
        }
        Ok(())
    }

    /// Writes magic and version at the start of `b`.
    ///
    /// # Panics
    ///
    /// If `b` is shorter than [`header_len`](Self::header_len).
    pub fn emit(&self, b: &mut [u8]) {
        b[..self.magic.len()].copy_from_slice(self.magic);
        b[self.magic.len()] = self.version;
    }
}

/// Defines a card view's fields once, as its layout table: for each, a getter and a
/// setter of a little-endian integer at a fixed offset (`name/set_name: type @
/// offset`, fields separated by commas, written a group of related fields a line).
///
/// ```text
/// card_fields!(VerbsCard { lid/set_lid: u16 @ 8, qpn/set_qpn: u32 @ 10 });
/// ```
macro_rules! card_fields {
    ($view:ident { $( $name:ident / $set:ident : $ty:ident @ $at:expr ),* $(,)? }) => {
        #[allow(dead_code)]
        impl<T: AsRef<[u8]>> $view<T> {
            $(
                pub(crate) fn $name(&self) -> $ty {
                    <$ty as $crate::wire::le::Field>::get(self.buf.as_ref(), $at)
                }
            )*
        }
        #[allow(dead_code)]
        impl<T: AsRef<[u8]> + AsMut<[u8]>> $view<T> {
            $(
                pub(crate) fn $set(&mut self, v: $ty) {
                    <$ty as $crate::wire::le::Field>::put(self.buf.as_mut(), $at, v)
                }
            )*
        }
    };
}
pub(crate) use card_fields;

/// Little-endian fields at byte offsets. Getters and setters panic when the field
/// runs past the buffer: views call them only after `new_checked` checked lengths.
pub mod le {
    /// The byte at `at`.
    pub fn u8(b: &[u8], at: usize) -> u8 {
        b[at]
    }

    /// Writes `v` at `at`.
    pub fn set_u8(b: &mut [u8], at: usize, v: u8) {
        b[at] = v;
    }

    /// The `u16` at `at`.
    pub fn u16(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
    }

    /// The `u32` at `at`.
    pub fn u32(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
    }

    /// The `u64` at `at`.
    pub fn u64(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
    }

    /// Writes `v` at `at`.
    pub fn set_u16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    /// Writes `v` at `at`.
    pub fn set_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// Writes `v` at `at`.
    pub fn set_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// An integer type a card field can have.
    pub trait Field: Sized {
        /// The field at `at`.
        fn get(b: &[u8], at: usize) -> Self;
        /// Writes the field at `at`.
        fn put(b: &mut [u8], at: usize, v: Self);
    }

    macro_rules! field_impl {
        ($($ty:ident $set:ident),*) => {$(
            impl Field for $ty {
                fn get(b: &[u8], at: usize) -> $ty {
                    $ty(b, at)
                }
                fn put(b: &mut [u8], at: usize, v: $ty) {
                    $set(b, at, v)
                }
            }
        )*};
    }
    field_impl!(u8 set_u8, u16 set_u16, u32 set_u32, u64 set_u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: CardFormat = CardFormat {
        name: "test card",
        magic: b"TEST",
        version: 1,
    };

    #[test]
    fn check_names_each_fault() {
        let mut b = vec![0u8; 8];
        F.emit(&mut b);
        assert!(F.check(&b, 8).is_ok());
        for (bytes, needle) in [
            (&b[..3], "does not start"),
            (&b[..6], "at least 8"),
            (&b"XEST\x01\0\0\0"[..], "does not start"),
            (&b"TEST\x02\0\0\0"[..], "version 2"),
        ] {
            let e = F.check(bytes, 8).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains(needle), "{e}");
        }
    }

    #[test]
    fn fields_round_trip() {
        let mut b = [0u8; 14];
        le::set_u16(&mut b, 0, 0xbeef);
        le::set_u32(&mut b, 2, 0xdead_beef);
        le::set_u64(&mut b, 6, u64::MAX - 1);
        assert_eq!(
            (le::u16(&b, 0), le::u32(&b, 2), le::u64(&b, 6)),
            (0xbeef, 0xdead_beef, u64::MAX - 1)
        );
    }
}
