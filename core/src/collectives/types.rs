//! The value types of the collectives API: data types, reduction operations, collective kinds.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Element types of collective buffers (NCCL's `ncclDataType_t` plus the fp8 formats).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `int8_t`.
    I8,
    /// `uint8_t`.
    U8,
    /// `int32_t`.
    I32,
    /// `uint32_t`.
    U32,
    /// `int64_t`.
    I64,
    /// `uint64_t`.
    U64,
    /// IEEE half precision.
    F16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// bfloat16.
    Bf16,
    /// fp8 e4m3 (finite, saturating).
    Fp8E4M3,
    /// fp8 e5m2.
    Fp8E5M2,
}

impl DataType {
    /// Every data type, in declaration order.
    pub const ALL: [DataType; 12] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
        DataType::Fp8E4M3,
        DataType::Fp8E5M2,
    ];

    /// Bytes of one element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::Fp8E4M3 | DataType::Fp8E5M2 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Whether the type is a floating-point format.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16
                | DataType::F32
                | DataType::F64
                | DataType::Bf16
                | DataType::Fp8E4M3
                | DataType::Fp8E5M2
        )
    }

    /// The short name kernels are instantiated under (`f16`, `bf16`, `fp8e4m3`, ...).
    pub fn kernel_name(self) -> &'static str {
        match self {
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
            DataType::F16 => "f16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::Bf16 => "bf16",
            DataType::Fp8E4M3 => "fp8e4m3",
            DataType::Fp8E5M2 => "fp8e5m2",
        }
    }

    /// The nccl-tests `-d` name (`half`, `float`, `bfloat16`, `int32`, ...).
    pub fn nccl_name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
            DataType::Fp8E4M3 => "f8e4m3",
            DataType::Fp8E5M2 => "f8e5m2",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.nccl_name())
    }
}

impl FromStr for DataType {
    type Err = Error;
    /// Accepts the nccl-tests names (`half`, `float`, `int32`, ...), NCCL's aliases (`int`,
    /// `uint8`, `fp16`, `bf16`, `fp8_e4m3`, ...) and the kernel names (`f16`, `fp8e4m3`).
    fn from_str(s: &str) -> Result<DataType> {
        let t = match s.to_ascii_lowercase().as_str() {
            "int8" | "i8" | "char" => DataType::I8,
            "uint8" | "u8" => DataType::U8,
            "int32" | "i32" | "int" => DataType::I32,
            "uint32" | "u32" => DataType::U32,
            "int64" | "i64" => DataType::I64,
            "uint64" | "u64" => DataType::U64,
            "half" | "float16" | "fp16" | "f16" => DataType::F16,
            "float" | "float32" | "fp32" | "f32" => DataType::F32,
            "double" | "float64" | "fp64" | "f64" => DataType::F64,
            "bfloat16" | "bf16" => DataType::Bf16,
            "f8e4m3" | "fp8e4m3" | "fp8_e4m3" | "e4m3" => DataType::Fp8E4M3,
            "f8e5m2" | "fp8e5m2" | "fp8_e5m2" | "e5m2" => DataType::Fp8E5M2,
            _ => {
                return Err(Error::invalid(format!(
                    "data type `{s}`: expected one of int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, f8e4m3, f8e5m2"
                )))
            }
        };
        Ok(t)
    }
}

/// Reduction operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (integers wrap).
    Sum,
    /// Product (integers wrap).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the number of ranks (integers: truncated toward zero).
    Avg,
}

impl ReduceOp {
    /// Every operation.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The name kernels are instantiated under, also nccl-tests' `-o` name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = Error;
    fn from_str(s: &str) -> Result<ReduceOp> {
        match s.to_ascii_lowercase().as_str() {
            "sum" => Ok(ReduceOp::Sum),
            "prod" => Ok(ReduceOp::Prod),
            "min" => Ok(ReduceOp::Min),
            "max" => Ok(ReduceOp::Max),
            "avg" => Ok(ReduceOp::Avg),
            _ => Err(Error::invalid(format!(
                "reduction `{s}`: expected one of sum, prod, min, max, avg"
            ))),
        }
    }
}

/// The collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    /// All-reduce.
    AllReduce,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// Broadcast.
    Broadcast,
}

impl CollectiveKind {
    /// Every collective.
    pub const ALL: [CollectiveKind; 4] = [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::Broadcast,
    ];

    /// Lower-case name (`allreduce`, `allgather`, `reducescatter`, `broadcast`).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "allreduce",
            CollectiveKind::AllGather => "allgather",
            CollectiveKind::ReduceScatter => "reducescatter",
            CollectiveKind::Broadcast => "broadcast",
        }
    }

    /// The environment variable that forces this collective's algorithm.
    pub fn env_var(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "MSCCLPP_ALLREDUCE_ALGO",
            CollectiveKind::AllGather => "MSCCLPP_ALLGATHER_ALGO",
            CollectiveKind::ReduceScatter => "MSCCLPP_REDUCESCATTER_ALGO",
            CollectiveKind::Broadcast => "MSCCLPP_BROADCAST_ALGO",
        }
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CollectiveKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<CollectiveKind> {
        match s.to_ascii_lowercase().replace(['_', '-'], "").as_str() {
            "allreduce" => Ok(CollectiveKind::AllReduce),
            "allgather" => Ok(CollectiveKind::AllGather),
            "reducescatter" => Ok(CollectiveKind::ReduceScatter),
            "broadcast" => Ok(CollectiveKind::Broadcast),
            _ => Err(Error::invalid(format!(
                "collective `{s}`: expected one of allreduce, allgather, reducescatter, broadcast"
            ))),
        }
    }
}

/// A CUstream / hipStream_t as an integer; 0 = the legacy default stream. Ignored on the
/// host backend (every call completes before it returns).
pub type RawStream = u64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_roundtrip() {
        for t in DataType::ALL {
            assert_eq!(t.nccl_name().parse::<DataType>().unwrap(), t);
            assert_eq!(t.kernel_name().parse::<DataType>().unwrap(), t);
        }
        for o in ReduceOp::ALL {
            assert_eq!(o.name().parse::<ReduceOp>().unwrap(), o);
        }
        for k in CollectiveKind::ALL {
            assert_eq!(k.name().parse::<CollectiveKind>().unwrap(), k);
        }
        let e = "quad".parse::<DataType>().unwrap_err().to_string();
        assert!(e.contains("bfloat16"), "{e}");
        assert!("xor".parse::<ReduceOp>().is_err());
        assert_eq!(DataType::Bf16.size_in_bytes(), 2);
    }
}
