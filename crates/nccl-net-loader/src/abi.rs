//! The ext-net ABI versions the loader drives, and the data symbol of each.

use std::fmt;

/// An ext-net ABI version this loader drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Abi {
    V8 = 8,
    V9 = 9,
    V10 = 10,
    V11 = 11,
    V12 = 12,
}

/// Name of the data symbol a v8 plugin exports.
pub const SYMBOL_V8: &str = "ncclNetPlugin_v8";

impl Abi {
    /// Newest first: the order NCCL 2.30 probes the symbols in.
    pub const NEWEST_FIRST: [Abi; 5] = [Abi::V12, Abi::V11, Abi::V10, Abi::V9, Abi::V8];

    /// The data symbol holding this version's table.
    pub fn symbol(self) -> &'static str {
        match self {
            Abi::V8 => SYMBOL_V8,
            Abi::V9 => "ncclNetPlugin_v9",
            Abi::V10 => "ncclNetPlugin_v10",
            Abi::V11 => "ncclNetPlugin_v11",
            Abi::V12 => "ncclNetPlugin_v12",
        }
    }

    pub fn number(self) -> u32 {
        self as u32
    }

    /// `v8`, `8`, `V11`, ... (case-insensitive).
    pub fn parse(s: &str) -> Result<Abi, String> {
        let t = s.trim();
        let n = t.strip_prefix(['v', 'V']).unwrap_or(t);
        match n {
            "8" => Ok(Abi::V8),
            "9" => Ok(Abi::V9),
            "10" => Ok(Abi::V10),
            "11" => Ok(Abi::V11),
            "12" => Ok(Abi::V12),
            _ => Err(format!("ABI {s:?}: expected v8, v9, v10, v11 or v12")),
        }
    }
}

impl fmt::Display for Abi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.number())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_names_parse() {
        assert_eq!(Abi::parse("v8"), Ok(Abi::V8));
        assert_eq!(Abi::parse("11"), Ok(Abi::V11));
        assert_eq!(Abi::parse(" V10 "), Ok(Abi::V10));
        assert_eq!(Abi::parse("v12"), Ok(Abi::V12));
        assert!(Abi::parse("v13").is_err());
        assert!(Abi::parse("v7").is_err());
        assert_eq!(Abi::V9.to_string(), "v9");
        assert_eq!(Abi::V10.symbol(), "ncclNetPlugin_v10");
    }
}
