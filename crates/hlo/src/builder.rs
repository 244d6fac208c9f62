//! The function builder: typed ops in, StableHLO text out.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

use siphon_mesh::{Mesh, MeshError, PartitionSpec};

use crate::{DType, HloError, Result, TensorType};

/// Gives every builder a distinct id so a value from one builder cannot silently name a
/// different value in another.
static NEXT_BUILDER: AtomicUsize = AtomicUsize::new(1);

/// A handle to a tensor value inside one [`Builder`]. Cheap to copy; ask the builder for
/// its type with [`Builder::ty`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Value {
    builder: usize,
    id: usize,
}

/// Dimension numbers of a `dot_general`: batching dimensions pair up lhs and rhs
/// dimensions one to one and come first in the result; contracting dimensions are summed
/// over; the remaining (free) lhs dimensions follow, then the free rhs dimensions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DotDims {
    /// Batching dimensions of the lhs.
    pub lhs_batch: Vec<usize>,
    /// Batching dimensions of the rhs.
    pub rhs_batch: Vec<usize>,
    /// Contracting dimensions of the lhs.
    pub lhs_contract: Vec<usize>,
    /// Contracting dimensions of the rhs.
    pub rhs_contract: Vec<usize>,
}

impl DotDims {
    /// Contract `lhs_contract` with `rhs_contract`, no batching dimensions.
    pub fn contract(lhs_contract: &[usize], rhs_contract: &[usize]) -> DotDims {
        DotDims { lhs_contract: lhs_contract.to_vec(), rhs_contract: rhs_contract.to_vec(), ..DotDims::default() }
    }

    /// Batched contraction.
    pub fn batched(
        lhs_batch: &[usize],
        rhs_batch: &[usize],
        lhs_contract: &[usize],
        rhs_contract: &[usize],
    ) -> DotDims {
        DotDims {
            lhs_batch: lhs_batch.to_vec(),
            rhs_batch: rhs_batch.to_vec(),
            lhs_contract: lhs_contract.to_vec(),
            rhs_contract: rhs_contract.to_vec(),
        }
    }
}

/// Comparison direction of [`Builder::compare`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareDir {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl CompareDir {
    fn mlir(self) -> &'static str {
        match self {
            CompareDir::Eq => "EQ",
            CompareDir::Ne => "NE",
            CompareDir::Lt => "LT",
            CompareDir::Le => "LE",
            CompareDir::Gt => "GT",
            CompareDir::Ge => "GE",
        }
    }
}

/// Builds one public function `@main` (the entry point XLA compiles) and prints it as a
/// StableHLO module named after the builder.
///
/// Ops append to the body in call order; every op validates its operands first and
/// leaves the builder unchanged when it returns an error.
#[derive(Debug)]
pub struct Builder {
    id: usize,
    name: String,
    mesh: Option<Mesh>,
    args: Vec<(usize, Option<PartitionSpec>)>,
    types: Vec<TensorType>,
    names: Vec<String>,
    body: String,
    regions: usize,
    /// While a region (a loop's condition or body) is being built: the first value id it
    /// may use; values below it live outside and must be passed in as block arguments.
    floors: Vec<usize>,
    /// Ids of the values of finished regions, which nothing outside them may use.
    closed: Vec<std::ops::Range<usize>>,
    /// Arguments donated to a result: (argument position, result index).
    donated: Vec<(usize, usize)>,
}

impl Builder {
    /// A builder for module `@name` without sharding annotations (single device).
    pub fn new(name: &str) -> Builder {
        Builder {
            id: NEXT_BUILDER.fetch_add(1, Ordering::Relaxed),
            name: name.to_string(),
            mesh: None,
            args: Vec::new(),
            types: Vec::new(),
            names: Vec::new(),
            body: String::new(),
            regions: 0,
            floors: Vec::new(),
            closed: Vec::new(),
            donated: Vec::new(),
        }
    }

    /// A builder whose module declares `sdy.mesh @mesh` from `mesh`, so that arguments,
    /// results and constraints can carry partition specs over its axes.
    pub fn with_mesh(name: &str, mesh: Mesh) -> Builder {
        let mut b = Builder::new(name);
        b.mesh = Some(mesh);
        b
    }

    /// The mesh, if the builder has one.
    pub fn mesh(&self) -> Option<&Mesh> {
        self.mesh.as_ref()
    }

    /// The type of `v`.
    pub fn ty(&self, v: Value) -> Result<&TensorType> {
        self.check("ty", v)?;
        Ok(&self.types[v.id])
    }

    /// The dimensions of `v`.
    pub fn dims(&self, v: Value) -> Result<&[usize]> {
        Ok(self.ty(v)?.dims())
    }

    /// The element type of `v`.
    pub fn dtype(&self, v: Value) -> Result<DType> {
        Ok(self.ty(v)?.dtype())
    }

    /// Adds a function argument. `sharding` (only with a mesh) says how it arrives split
    /// over the devices; `None` leaves it to the partitioner (replicated for inputs).
    pub fn arg(&mut self, ty: TensorType, sharding: Option<PartitionSpec>) -> Result<Value> {
        let what = format!("argument {} {ty}", self.args.len());
        if let Some(spec) = &sharding {
            self.check_spec(&what, spec, ty.dims(), true)?;
        }
        let name = format!("%arg{}", self.args.len());
        let v = self.push_value(name, ty);
        self.args.push((v.id, sharding));
        Ok(v)
    }

    /// Donates argument `arg` to result `result` (`tf.aliasing_output`): the program may
    /// write that result into the argument's buffer, which the caller must not use after
    /// running it. The result must have the argument's type (checked at [`Builder::finish`]).
    pub fn donate(&mut self, arg: Value, result: usize) -> Result<()> {
        self.ty_of("donate", arg)?;
        let position = self
            .args
            .iter()
            .position(|(id, _)| *id == arg.id)
            .ok_or_else(|| shape_err("donate", format!("{} is not an argument", self.name(arg))))?;
        if self.donated.iter().any(|&(a, r)| a == position || r == result) {
            return Err(shape_err("donate", format!("argument {position} or result {result} is donated twice")));
        }
        self.donated.push((position, result));
        Ok(())
    }

    // ---------------------------------------------------------------- constants, iota

    /// A tensor of `ty` with every element `value` (rounded to the dtype; integers
    /// truncate toward zero, predicates are `value != 0`).
    pub fn splat(&mut self, value: f64, ty: TensorType) -> Result<Value> {
        let lit = scalar_literal(value, ty.dtype());
        let line = format!("stablehlo.constant dense<{lit}> : {ty}");
        Ok(self.emit(line, ty))
    }

    /// A scalar constant.
    pub fn scalar(&mut self, value: f64, dtype: DType) -> Result<Value> {
        self.splat(value, TensorType::scalar(dtype))
    }

    /// An f32 constant tensor from row-major data.
    pub fn constant_f32(&mut self, data: &[f32], dims: &[usize]) -> Result<Value> {
        let ty = TensorType::new(DType::F32, dims);
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.constant_bytes(&bytes, ty)
    }

    /// An i32 constant tensor from row-major data.
    pub fn constant_i32(&mut self, data: &[i32], dims: &[usize]) -> Result<Value> {
        let ty = TensorType::new(DType::I32, dims);
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.constant_bytes(&bytes, ty)
    }

    /// A constant from raw little-endian row-major bytes (not for `Pred`).
    pub fn constant_bytes(&mut self, bytes: &[u8], ty: TensorType) -> Result<Value> {
        if ty.dtype() == DType::Pred {
            return Err(HloError::Constant("pred constants must be splats".into()));
        }
        if bytes.len() != ty.byte_size() {
            return Err(HloError::Constant(format!("{} bytes given for {ty} ({} bytes)", bytes.len(), ty.byte_size())));
        }
        let mut hex = String::with_capacity(bytes.len() * 2);
        for byte in bytes {
            write!(hex, "{byte:02X}").expect("writing to a String cannot fail");
        }
        let line = format!("stablehlo.constant dense<\"0x{hex}\"> : {ty}");
        Ok(self.emit(line, ty))
    }

    /// `0, 1, 2, …` along dimension `dim` of a tensor of `ty`.
    pub fn iota(&mut self, ty: TensorType, dim: usize) -> Result<Value> {
        if dim >= ty.rank() {
            return Err(shape_err("iota", format!("dimension {dim} out of range for {ty}")));
        }
        if ty.dtype() == DType::Pred {
            return Err(dtype_err("iota", format!("iota of {ty} needs a numeric type")));
        }
        let line = format!("stablehlo.iota dim = {dim} : {ty}");
        Ok(self.emit(line, ty))
    }

    // ---------------------------------------------------------------- elementwise

    /// `a + b` (same type).
    pub fn add(&mut self, a: Value, b: Value) -> Result<Value> {
        self.binary("add", a, b, Kind::Numeric)
    }

    /// `a - b` (same type).
    pub fn sub(&mut self, a: Value, b: Value) -> Result<Value> {
        self.binary("subtract", a, b, Kind::Numeric)
    }

    /// `a * b` (same type).
    pub fn mul(&mut self, a: Value, b: Value) -> Result<Value> {
        self.binary("multiply", a, b, Kind::Numeric)
    }

    /// `a / b` (same type).
    pub fn div(&mut self, a: Value, b: Value) -> Result<Value> {
        self.binary("divide", a, b, Kind::Numeric)
    }

    /// The remainder of `a / b` (same type), with the sign of `a`.
    pub fn rem(&mut self, a: Value, b: Value) -> Result<Value> {
        self.binary("remainder", a, b, Kind::Numeric)
    }

    /// Elementwise maximum.
    pub fn max(&mut self, a: Value, b: Value) -> Result<Value> {
        self.binary("maximum", a, b, Kind::Numeric)
    }

    /// Elementwise minimum.
    pub fn min(&mut self, a: Value, b: Value) -> Result<Value> {
        self.binary("minimum", a, b, Kind::Numeric)
    }

    /// `a ^ b` elementwise (floats).
    pub fn pow(&mut self, a: Value, b: Value) -> Result<Value> {
        self.binary("power", a, b, Kind::Float)
    }

    /// Logical and of predicates (or bitwise and of integers).
    pub fn and(&mut self, a: Value, b: Value) -> Result<Value> {
        self.binary("and", a, b, Kind::IntOrPred)
    }

    /// Logical or of predicates (or bitwise or of integers).
    pub fn or(&mut self, a: Value, b: Value) -> Result<Value> {
        self.binary("or", a, b, Kind::IntOrPred)
    }

    /// `a >> b` on unsigned bits (zeros shifted in), elementwise on integers.
    pub fn shift_right_logical(&mut self, a: Value, b: Value) -> Result<Value> {
        self.binary("shift_right_logical", a, b, Kind::IntOrPred)
    }

    /// `-a`.
    pub fn neg(&mut self, a: Value) -> Result<Value> {
        self.unary("negate", a, Kind::Numeric)
    }

    /// `|a|`.
    pub fn abs(&mut self, a: Value) -> Result<Value> {
        self.unary("abs", a, Kind::Numeric)
    }

    /// `1 / sqrt(a)`.
    pub fn rsqrt(&mut self, a: Value) -> Result<Value> {
        self.unary("rsqrt", a, Kind::Float)
    }

    /// `sqrt(a)`.
    pub fn sqrt(&mut self, a: Value) -> Result<Value> {
        self.unary("sqrt", a, Kind::Float)
    }

    /// `e^a`.
    pub fn exp(&mut self, a: Value) -> Result<Value> {
        self.unary("exponential", a, Kind::Float)
    }

    /// Natural logarithm.
    pub fn log(&mut self, a: Value) -> Result<Value> {
        self.unary("log", a, Kind::Float)
    }

    /// `log(1 + a)`, accurate near 0.
    pub fn log_plus_one(&mut self, a: Value) -> Result<Value> {
        self.unary("log_plus_one", a, Kind::Float)
    }

    /// `1 / (1 + e^-a)`.
    pub fn logistic(&mut self, a: Value) -> Result<Value> {
        self.unary("logistic", a, Kind::Float)
    }

    /// Hyperbolic tangent.
    pub fn tanh(&mut self, a: Value) -> Result<Value> {
        self.unary("tanh", a, Kind::Float)
    }

    /// The error function, as CHLO's `erf` (StableHLO has none; XLA lowers it, as it does for
    /// JAX's `lax.erf`).
    pub fn erf(&mut self, a: Value) -> Result<Value> {
        let ta = self.ty_of("erf", a)?.clone();
        Kind::Float.check("erf", &ta)?;
        let line = format!("chlo.erf {} : {ta} -> {ta}", self.name(a));
        Ok(self.emit(line, ta))
    }

    /// Sine.
    pub fn sin(&mut self, a: Value) -> Result<Value> {
        self.unary("sine", a, Kind::Float)
    }

    /// Cosine.
    pub fn cos(&mut self, a: Value) -> Result<Value> {
        self.unary("cosine", a, Kind::Float)
    }

    /// Elementwise comparison; the result is a `Pred` tensor of the operands' shape.
    pub fn compare(&mut self, dir: CompareDir, a: Value, b: Value) -> Result<Value> {
        let ta = self.ty_of("compare", a)?.clone();
        let tb = self.ty_of("compare", b)?.clone();
        if ta != tb {
            return Err(mismatch("compare", &ta, &tb));
        }
        let kind = match ta.dtype() {
            d if d.is_float() => "FLOAT",
            d if d.is_unsigned() || d == DType::Pred => "UNSIGNED",
            _ => "SIGNED",
        };
        let out = ta.with_dtype(DType::Pred);
        let line = format!(
            "stablehlo.compare  {}, {}, {},  {kind} : ({ta}, {tb}) -> {out}",
            dir.mlir(),
            self.name(a),
            self.name(b)
        );
        Ok(self.emit(line, out))
    }

    /// `pred ? on_true : on_false` elementwise; `pred` is a `Pred` tensor of the same
    /// shape or a `Pred` scalar.
    pub fn select(&mut self, pred: Value, on_true: Value, on_false: Value) -> Result<Value> {
        let tp = self.ty_of("select", pred)?.clone();
        let tt = self.ty_of("select", on_true)?.clone();
        let tf = self.ty_of("select", on_false)?.clone();
        if tt != tf {
            return Err(mismatch("select", &tt, &tf));
        }
        if tp.dtype() != DType::Pred {
            return Err(dtype_err("select", format!("predicate must be i1, got {tp}")));
        }
        if tp.rank() != 0 && tp.dims() != tt.dims() {
            return Err(shape_err("select", format!("predicate {tp} does not match {tt}")));
        }
        let line = format!(
            "stablehlo.select {}, {}, {} : {tp}, {tt}",
            self.name(pred),
            self.name(on_true),
            self.name(on_false)
        );
        Ok(self.emit(line, tt))
    }

    /// Reinterprets the bits of `a` as `dtype`: the same shape when the element sizes are
    /// equal; to a narrower type, a new minor dimension of the size ratio (an `f32[n]` as
    /// `ui8[n, 4]`, its bytes in memory order: little-endian on every backend siphon runs).
    pub fn bitcast_convert(&mut self, a: Value, dtype: DType) -> Result<Value> {
        let ta = self.ty_of("bitcast_convert", a)?.clone();
        let (from, to) = (ta.dtype().byte_size(), dtype.byte_size());
        if from < to || from % to != 0 || ta.dtype() == DType::Pred || dtype == DType::Pred {
            let detail = format!("from {} to {dtype}: only to an equal or narrower type", ta.dtype());
            return Err(HloError::DType { op: "bitcast_convert", detail });
        }
        let mut dims = ta.dims().to_vec();
        if from > to {
            dims.push(from / to);
        }
        let out = TensorType::new(dtype, &dims);
        let line = format!("stablehlo.bitcast_convert {} : ({ta}) -> {out}", self.name(a));
        Ok(self.emit(line, out))
    }

    /// Converts to another element type (floats round to nearest even; float to int
    /// truncates).
    pub fn convert(&mut self, a: Value, dtype: DType) -> Result<Value> {
        let ta = self.ty_of("convert", a)?.clone();
        if ta.dtype() == dtype {
            return Ok(a);
        }
        let out = ta.with_dtype(dtype);
        let line = format!("stablehlo.convert {} : ({ta}) -> {out}", self.name(a));
        Ok(self.emit(line, out))
    }

    // ---------------------------------------------------------------- shape ops

    /// Broadcasts `a` to `dims`: operand dimension `i` becomes result dimension
    /// `mapping[i]` (its size must equal that dimension or be 1); the other result
    /// dimensions are new.
    pub fn broadcast_in_dim(&mut self, a: Value, dims: &[usize], mapping: &[usize]) -> Result<Value> {
        let ta = self.ty_of("broadcast_in_dim", a)?.clone();
        if mapping.len() != ta.rank() {
            return Err(shape_err(
                "broadcast_in_dim",
                format!("{ta} needs {} mapped dimensions, got {mapping:?}", ta.rank()),
            ));
        }
        for (i, &m) in mapping.iter().enumerate() {
            let ok = m < dims.len() && !mapping[..i].contains(&m) && (ta.dims()[i] == dims[m] || ta.dims()[i] == 1);
            if !ok {
                return Err(shape_err(
                    "broadcast_in_dim",
                    format!("cannot broadcast {ta} to {dims:?} with dims = {mapping:?}"),
                ));
            }
        }
        let out = TensorType::new(ta.dtype(), dims);
        let line = format!("stablehlo.broadcast_in_dim {}, dims = {} : ({ta}) -> {out}", self.name(a), list(mapping));
        Ok(self.emit(line, out))
    }

    /// Broadcasts `a` to `dims` aligning its dimensions with the trailing ones, like
    /// NumPy (a scalar becomes a splat).
    pub fn broadcast_to(&mut self, a: Value, dims: &[usize]) -> Result<Value> {
        let rank = self.ty_of("broadcast_to", a)?.rank();
        if rank > dims.len() {
            return Err(shape_err("broadcast_to", format!("cannot broadcast rank {rank} to {dims:?}")));
        }
        let mapping: Vec<usize> = (dims.len() - rank..dims.len()).collect();
        self.broadcast_in_dim(a, dims, &mapping)
    }

    /// Same elements, new shape (element count must match).
    pub fn reshape(&mut self, a: Value, dims: &[usize]) -> Result<Value> {
        let ta = self.ty_of("reshape", a)?.clone();
        let out = TensorType::new(ta.dtype(), dims);
        if out.num_elements() != ta.num_elements() {
            return Err(shape_err("reshape", format!("cannot reshape {ta} to {out}")));
        }
        if out == ta {
            return Ok(a);
        }
        let line = format!("stablehlo.reshape {} : ({ta}) -> {out}", self.name(a));
        Ok(self.emit(line, out))
    }

    /// Permutes dimensions: result dimension `i` is operand dimension `perm[i]`.
    pub fn transpose(&mut self, a: Value, perm: &[usize]) -> Result<Value> {
        let ta = self.ty_of("transpose", a)?.clone();
        if !is_permutation(perm, ta.rank()) {
            return Err(shape_err("transpose", format!("{perm:?} is not a permutation of {ta}'s dimensions")));
        }
        let dims: Vec<usize> = perm.iter().map(|&p| ta.dims()[p]).collect();
        let out = TensorType::new(ta.dtype(), &dims);
        let line = format!("stablehlo.transpose {}, dims = {} : ({ta}) -> {out}", self.name(a), list(perm));
        Ok(self.emit(line, out))
    }

    /// `a[start:limit:stride]` per dimension.
    pub fn slice(&mut self, a: Value, start: &[usize], limit: &[usize], strides: &[usize]) -> Result<Value> {
        let ta = self.ty_of("slice", a)?.clone();
        let r = ta.rank();
        if start.len() != r || limit.len() != r || strides.len() != r {
            return Err(shape_err("slice", format!("{ta} needs {r} start/limit/stride values")));
        }
        let mut dims = Vec::with_capacity(r);
        for d in 0..r {
            if start[d] > limit[d] || limit[d] > ta.dims()[d] || strides[d] == 0 {
                return Err(shape_err(
                    "slice",
                    format!("bad range {}:{}:{} for dimension {d} of {ta}", start[d], limit[d], strides[d]),
                ));
            }
            dims.push((limit[d] - start[d]).div_ceil(strides[d]));
        }
        let out = TensorType::new(ta.dtype(), &dims);
        let line = format!(
            "stablehlo.slice {} [{}] : ({ta}) -> {out}",
            self.name(a),
            (0..r)
                .map(|d| if strides[d] == 1 {
                    format!("{}:{}", start[d], limit[d])
                } else {
                    format!("{}:{}:{}", start[d], limit[d], strides[d])
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(self.emit(line, out))
    }

    /// `a[.., start..limit, ..]` along one dimension.
    pub fn slice_dim(&mut self, a: Value, dim: usize, start: usize, limit: usize) -> Result<Value> {
        let dims = self.ty_of("slice", a)?.dims().to_vec();
        if dim >= dims.len() {
            return Err(shape_err("slice", format!("dimension {dim} out of range for {dims:?}")));
        }
        let mut s = vec![0; dims.len()];
        let mut l = dims.clone();
        s[dim] = start;
        l[dim] = limit;
        self.slice(a, &s, &l, &vec![1; dims.len()])
    }

    /// Joins tensors along `dim` (all other dimensions and the dtype must agree).
    pub fn concatenate(&mut self, parts: &[Value], dim: usize) -> Result<Value> {
        if parts.is_empty() {
            return Err(shape_err("concatenate", "needs at least one operand".into()));
        }
        let types: Vec<TensorType> =
            parts.iter().map(|&p| self.ty_of("concatenate", p).cloned()).collect::<Result<_>>()?;
        let first = &types[0];
        if dim >= first.rank() {
            return Err(shape_err("concatenate", format!("dimension {dim} out of range for {first}")));
        }
        let mut out_dims = first.dims().to_vec();
        out_dims[dim] = 0;
        for t in &types {
            let same_rest =
                t.rank() == first.rank() && (0..t.rank()).all(|d| d == dim || t.dims()[d] == first.dims()[d]);
            if t.dtype() != first.dtype() || !same_rest {
                return Err(shape_err("concatenate", format!("{t} does not fit {first} along dimension {dim}")));
            }
            out_dims[dim] += t.dims()[dim];
        }
        let out = TensorType::new(first.dtype(), &out_dims);
        let names: Vec<&str> = parts.iter().map(|&p| self.name(p)).collect();
        let tys: Vec<String> = types.iter().map(|t| t.to_string()).collect();
        let line = format!("stablehlo.concatenate {}, dim = {dim} : ({}) -> {out}", names.join(", "), tys.join(", "));
        Ok(self.emit(line, out))
    }

    // ---------------------------------------------------------------- compute

    /// General matrix product; see [`DotDims`] for the result layout. The result has the
    /// operands' dtype; f32 and f64 operands are multiplied at `HIGHEST` precision.
    pub fn dot_general(&mut self, lhs: Value, rhs: Value, dims: &DotDims) -> Result<Value> {
        let dtype = self.dtype(lhs).map_err(|_| foreign("dot_general", lhs))?;
        self.dot_general_to(lhs, rhs, dims, dtype)
    }

    /// General matrix product accumulating into and returning `out_dtype` (e.g. bf16
    /// operands, f32 result).
    pub fn dot_general_to(&mut self, lhs: Value, rhs: Value, dims: &DotDims, out_dtype: DType) -> Result<Value> {
        let tl = self.ty_of("dot_general", lhs)?.clone();
        let tr = self.ty_of("dot_general", rhs)?.clone();
        if tl.dtype() != tr.dtype() {
            return Err(dtype_err("dot_general", format!("operand dtypes differ: {tl} vs {tr}")));
        }
        if tl.dtype() == DType::Pred || out_dtype == DType::Pred {
            return Err(dtype_err("dot_general", format!("{tl} is not numeric")));
        }
        let bad = |d: String| Err(shape_err("dot_general", format!("{d} for {tl} x {tr} ({dims:?})")));
        if dims.lhs_batch.len() != dims.rhs_batch.len() || dims.lhs_contract.len() != dims.rhs_contract.len() {
            return bad("batch/contracting dimension lists differ in length".into());
        }
        let lhs_used: Vec<usize> = dims.lhs_batch.iter().chain(&dims.lhs_contract).copied().collect();
        let rhs_used: Vec<usize> = dims.rhs_batch.iter().chain(&dims.rhs_contract).copied().collect();
        if !distinct_below(&lhs_used, tl.rank()) || !distinct_below(&rhs_used, tr.rank()) {
            return bad("repeated or out-of-range dimension".into());
        }
        for (&l, &r) in
            dims.lhs_batch.iter().zip(&dims.rhs_batch).chain(dims.lhs_contract.iter().zip(&dims.rhs_contract))
        {
            if tl.dims()[l] != tr.dims()[r] {
                return bad(format!("lhs dimension {l} ({}) != rhs dimension {r} ({})", tl.dims()[l], tr.dims()[r]));
            }
        }
        let mut out_dims: Vec<usize> = dims.lhs_batch.iter().map(|&d| tl.dims()[d]).collect();
        out_dims.extend((0..tl.rank()).filter(|d| !lhs_used.contains(d)).map(|d| tl.dims()[d]));
        out_dims.extend((0..tr.rank()).filter(|d| !rhs_used.contains(d)).map(|d| tr.dims()[d]));
        let out = TensorType::new(out_dtype, &out_dims);
        let mut attrs = String::new();
        if !dims.lhs_batch.is_empty() {
            write!(attrs, ", batching_dims = {} x {}", list(&dims.lhs_batch), list(&dims.rhs_batch))
                .expect("writing to a String cannot fail");
        }
        write!(attrs, ", contracting_dims = {} x {}", list(&dims.lhs_contract), list(&dims.rhs_contract))
            .expect("writing to a String cannot fail");
        // f32 products in full f32: XLA's default lets a GPU round the operands to TF32
        // (10-bit mantissa), ~1e-3 relative, which no golden tolerates. No-op on the CPU.
        if matches!(tl.dtype(), DType::F32 | DType::F64) {
            attrs.push_str(", precision = [HIGHEST, HIGHEST]");
        }
        let line =
            format!("stablehlo.dot_general {}, {}{attrs} : ({tl}, {tr}) -> {out}", self.name(lhs), self.name(rhs));
        Ok(self.emit(line, out))
    }

    /// The grouped product `chlo.ragged_dot` (`jax.lax.ragged_dot`): `lhs` `[m, k]` holds
    /// the groups' rows one after another, `group_sizes` (i32 `[g]`) how many each has, and
    /// `rhs` `[g, k, n]` (`rhs_contract` 1) or `[g, n, k]` (2) each group's matrix; row `i`
    /// of the result `[m, n]` is `lhs[i] · rhs[its group]`, and rows past the groups' total
    /// are 0. XLA compiles it without a loop on TPU (and GPU); the CPU plugin has no
    /// `ragged-dot` ([`Builder::ragged_dot_masked`] gives its values there).
    pub fn ragged_dot(&mut self, lhs: Value, rhs: Value, group_sizes: Value, rhs_contract: usize) -> Result<Value> {
        let [tl, tr, tg, out] = self.ragged_dot_types(lhs, rhs, group_sizes, rhs_contract)?;
        let precision = match tl.dtype() {
            DType::F32 | DType::F64 => "HIGHEST",
            _ => "DEFAULT",
        };
        let line = format!(
            "\"chlo.ragged_dot\"({}, {}, {}) <{{precision_config = [#chlo<precision {precision}>, \
             #chlo<precision {precision}>], ragged_dot_dimension_numbers = #chlo.ragged_dot<\
             lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [{rhs_contract}], \
             lhs_ragged_dimensions = [0], rhs_group_dimensions = [0]>}}> : ({tl}, {tr}, {tg}) -> {out}",
            self.name(lhs),
            self.name(rhs),
            self.name(group_sizes)
        );
        Ok(self.emit(line, out))
    }

    /// [`Builder::ragged_dot`]'s values by XLA's ordinary ops, as JAX lowers
    /// `jax.lax.ragged_dot` for the CPU (whose XLA has no `ragged-dot`): each group's copy of
    /// `lhs` with the rows of other groups zeroed, `[g, m, k]`, contracted with `rhs` over
    /// `k` and the groups at once. Each row sums its own group's product and exact zeros;
    /// `g` times the work and the memory of the grouped product.
    pub fn ragged_dot_masked(
        &mut self,
        lhs: Value,
        rhs: Value,
        group_sizes: Value,
        rhs_contract: usize,
    ) -> Result<Value> {
        let [tl, tr, ..] = self.ragged_dot_types(lhs, rhs, group_sizes, rhs_contract)?;
        let (m, k, g) = (tl.dims()[0], tl.dims()[1], tr.dims()[0]);
        let i32t = |dims: &[usize]| TensorType::new(DType::I32, dims);
        // Each group's first row: the sizes of the groups before it, summed.
        let sizes = self.broadcast_in_dim(group_sizes, &[g, g], &[1])?;
        let (earlier, group) = (self.iota(i32t(&[g, g]), 1)?, self.iota(i32t(&[g, g]), 0)?);
        let before = self.compare(CompareDir::Lt, earlier, group)?;
        let zero = self.splat(0.0, i32t(&[g, g]))?;
        let before = self.select(before, sizes, zero)?;
        let starts = self.reduce_sum(before, &[1])?;
        let ends = self.add(starts, group_sizes)?;
        let row = self.iota(i32t(&[g, m, k]), 1)?;
        let starts = self.broadcast_in_dim(starts, &[g, m, k], &[0])?;
        let ends = self.broadcast_in_dim(ends, &[g, m, k], &[0])?;
        let from = self.compare(CompareDir::Le, starts, row)?;
        let to = self.compare(CompareDir::Lt, row, ends)?;
        let mine = self.and(from, to)?;
        let rows = self.broadcast_in_dim(lhs, &[g, m, k], &[1, 2])?;
        let none = self.splat(0.0, TensorType::new(tl.dtype(), &[g, m, k]))?;
        let rows = self.select(mine, rows, none)?;
        self.dot_general(rows, rhs, &DotDims::contract(&[2, 0], &[rhs_contract, 0]))
    }

    /// The operands' types of a grouped product, checked, and its result's.
    fn ragged_dot_types(
        &self,
        lhs: Value,
        rhs: Value,
        group_sizes: Value,
        rhs_contract: usize,
    ) -> Result<[TensorType; 4]> {
        let tl = self.ty_of("ragged_dot", lhs)?.clone();
        let tr = self.ty_of("ragged_dot", rhs)?.clone();
        let tg = self.ty_of("ragged_dot", group_sizes)?.clone();
        if tl.dtype() != tr.dtype() || tg.dtype() != DType::I32 {
            return Err(dtype_err("ragged_dot", format!("{tl} x {tr} in groups {tg}")));
        }
        let bad = |d: &str| Err(shape_err("ragged_dot", format!("{d}: {tl} x {tr} in groups {tg}")));
        if tl.rank() != 2 || tr.rank() != 3 || tg.dims() != [tr.dims()[0]] || !matches!(rhs_contract, 1 | 2) {
            return bad("needs [m, k] x [g, k, n] or [g, n, k] with [g] group sizes");
        }
        if tl.dims()[1] != tr.dims()[rhs_contract] {
            return bad("the contracted widths differ");
        }
        let out = TensorType::new(tl.dtype(), &[tl.dims()[0], tr.dims()[3 - rhs_contract]]);
        Ok([tl, tr, tg, out])
    }

    /// `[.., k] x [k, n] -> [.., n]`: contracts the last dimension of `a` with the first
    /// of a rank-2 `b`.
    pub fn matmul(&mut self, a: Value, b: Value) -> Result<Value> {
        let ra = self.ty_of("matmul", a)?.rank();
        if ra == 0 {
            return Err(shape_err("matmul", "lhs is a scalar".into()));
        }
        self.dot_general(a, b, &DotDims::contract(&[ra - 1], &[0]))
    }

    /// `[.., k] x [n, k] -> [.., n]`: multiplies by the transpose of `w` without a
    /// transpose op (the layout of Hugging Face linear weights, `[out, in]`).
    pub fn matmul_t(&mut self, a: Value, w: Value) -> Result<Value> {
        let ra = self.ty_of("matmul_t", a)?.rank();
        if ra == 0 {
            return Err(shape_err("matmul_t", "lhs is a scalar".into()));
        }
        self.dot_general(a, w, &DotDims::contract(&[ra - 1], &[1]))
    }

    /// `[.., k] x [n, k] -> [.., n]` as [`Builder::matmul_t`], computed as `w · aᵀ` (`[n, ..]`)
    /// kept whole by an optimization barrier, then transposed back. The same products; XLA's
    /// CPU libraries take `w` as it lies this way, where `a · wᵀ` repacks the whole weight on
    /// every call — most of a product's time when `a` has few rows (a decoding step's).
    pub fn matmul_t_weight_first(&mut self, a: Value, w: Value) -> Result<Value> {
        let ra = self.ty_of("matmul_t_weight_first", a)?.rank();
        if ra == 0 {
            return Err(shape_err("matmul_t_weight_first", "lhs is a scalar".into()));
        }
        let y = self.dot_general(w, a, &DotDims::contract(&[1], &[ra - 1]))?;
        // Without the barrier XLA folds the transpose into the product, back to `a · wᵀ`.
        let y = self.optimization_barrier(y)?;
        let perm: Vec<usize> = (1..ra).chain([0]).collect();
        self.transpose(y, &perm)
    }

    /// `a` unchanged, as a value XLA's passes do not look through (`stablehlo.optimization_barrier`).
    pub fn optimization_barrier(&mut self, a: Value) -> Result<Value> {
        let ta = self.ty_of("optimization_barrier", a)?.clone();
        let line = format!("stablehlo.optimization_barrier {} : {ta}", self.name(a));
        Ok(self.emit(line, ta))
    }

    /// Sum over `dims` (removed from the shape).
    pub fn reduce_sum(&mut self, a: Value, dims: &[usize]) -> Result<Value> {
        self.reduce("add", 0.0, a, dims)
    }

    /// Maximum over `dims` (removed from the shape).
    pub fn reduce_max(&mut self, a: Value, dims: &[usize]) -> Result<Value> {
        let init = match self.dtype(a).map_err(|_| foreign("reduce", a))? {
            d if d.is_float() => f64::NEG_INFINITY,
            DType::I8 => i8::MIN as f64,
            DType::I32 => i32::MIN as f64,
            DType::I64 => i64::MIN as f64,
            _ => 0.0,
        };
        self.reduce("maximum", init, a, dims)
    }

    /// Pins the sharding of an intermediate value (`sdy.sharding_constraint`), guiding the
    /// partitioner where propagation alone would choose badly.
    pub fn sharding_constraint(&mut self, a: Value, spec: &PartitionSpec) -> Result<Value> {
        let ta = self.ty_of("sharding_constraint", a)?.clone();
        let what = format!("constraint on {} {ta}", self.name(a));
        self.check_spec(&what, spec, ta.dims(), false)?;
        let line = format!("sdy.sharding_constraint {} {} : {ta}", self.name(a), sharding_body(spec));
        Ok(self.emit(line, ta))
    }

    /// Embedding lookup: `table [rows, ..]` indexed by integer `indices` of any shape
    /// gives `indices.shape ++ table.shape[1..]` (a `stablehlo.gather`). Out-of-range
    /// indices are clamped, as gather does.
    pub fn take_rows(&mut self, table: Value, indices: Value) -> Result<Value> {
        let tt = self.ty_of("take_rows", table)?.clone();
        let ti = self.ty_of("take_rows", indices)?.clone();
        if tt.rank() == 0 {
            return Err(shape_err("take_rows", format!("table {tt} has no rows")));
        }
        if !ti.dtype().is_int() {
            return Err(dtype_err("take_rows", format!("indices must be integers, got {ti}")));
        }
        let batch = ti.rank();
        let mut out_dims = ti.dims().to_vec();
        out_dims.extend_from_slice(&tt.dims()[1..]);
        let out = TensorType::new(tt.dtype(), &out_dims);
        let offset_dims: Vec<usize> = (batch..batch + tt.rank() - 1).collect();
        let mut slice_sizes = vec![1];
        slice_sizes.extend_from_slice(&tt.dims()[1..]);
        let line = format!(
            "\"stablehlo.gather\"({}, {}) <{{dimension_numbers = #stablehlo.gather<offset_dims = {}, collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = {batch}>, indices_are_sorted = false, slice_sizes = array<i64: {}>}}> : ({tt}, {ti}) -> {out}",
            self.name(table),
            self.name(indices),
            list(&offset_dims),
            slice_sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", "),
        );
        Ok(self.emit(line, out))
    }

    /// Gathers along `index_dims` of `table`, batched over its `batch_dim`:
    /// `indices [G, m…, n]` (integers, `n = index_dims.len()`, `G` = the table's `batch_dim`)
    /// gives `[G, m…, r…]` where `r…` are the table's other dimensions in order and
    /// `out[g, m…, r…] = table[g at batch_dim, indices[g, m…, :] at index_dims, r…]`.
    /// Out-of-range indices are clamped, as gather does.
    pub fn take_along(
        &mut self,
        table: Value,
        batch_dim: usize,
        index_dims: &[usize],
        indices: Value,
    ) -> Result<Value> {
        let (tt, ti, rest, out) = self.along("take_along", table, batch_dim, index_dims, indices)?;
        let offset_dims: Vec<usize> = (ti.rank() - 1..ti.rank() - 1 + rest.len()).collect();
        let mut collapsed = index_dims.to_vec();
        collapsed.sort_unstable();
        let sizes: Vec<String> =
            (0..tt.rank()).map(|d| if rest.contains(&d) { tt.dims()[d] } else { 1 }.to_string()).collect();
        let line = format!(
            "\"stablehlo.gather\"({}, {}) <{{dimension_numbers = #stablehlo.gather<offset_dims = {}, collapsed_slice_dims = {}, operand_batching_dims = [{batch_dim}], start_indices_batching_dims = [0], start_index_map = {}, index_vector_dim = {}>, indices_are_sorted = false, slice_sizes = array<i64: {}>}}> : ({tt}, {ti}) -> {out}",
            self.name(table),
            self.name(indices),
            list(&offset_dims),
            list(&collapsed),
            list(index_dims),
            ti.rank() - 1,
            sizes.join(", "),
        );
        Ok(self.emit(line, out))
    }

    /// The inverse of [`Builder::take_along`]: `table` with `updates` (shaped as `take_along`'s
    /// result for these `indices`) written where `take_along` would read them,
    /// `out[g at batch_dim, indices[g, m…, :] at index_dims, r…] = updates[g, m…, r…]`; an
    /// update whose index is out of range is dropped (`stablehlo.scatter`, replacing). Indices
    /// must not repeat within a batch element.
    pub fn put_along(
        &mut self,
        table: Value,
        batch_dim: usize,
        index_dims: &[usize],
        indices: Value,
        updates: Value,
    ) -> Result<Value> {
        let (tt, ti, rest, want) = self.along("put_along", table, batch_dim, index_dims, indices)?;
        let tu = self.ty_of("put_along", updates)?.clone();
        if tu != want {
            return Err(shape_err("put_along", format!("updates {tu} must be {want}")));
        }
        let window: Vec<usize> = (ti.rank() - 1..ti.rank() - 1 + rest.len()).collect();
        let mut inserted = index_dims.to_vec();
        inserted.sort_unstable();
        let scalar = TensorType::scalar(tt.dtype());
        let r = self.regions;
        self.regions += 1;
        let line = format!(
            "\"stablehlo.scatter\"({}, {}, {}) <{{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = {}, inserted_window_dims = {}, input_batching_dims = [{batch_dim}], scatter_indices_batching_dims = [0], scatter_dims_to_operand_dims = {}, index_vector_dim = {}>, unique_indices = false}}> ({{\n    ^bb0(%r{r}_a: {scalar}, %r{r}_b: {scalar}):\n      stablehlo.return %r{r}_b : {scalar}\n    }}) : ({tt}, {ti}, {tu}) -> {tt}",
            self.name(table),
            self.name(indices),
            self.name(updates),
            list(&window),
            list(&inserted),
            list(index_dims),
            ti.rank() - 1,
        );
        Ok(self.emit(line, tt))
    }

    /// [`Builder::take_along`]'s and [`Builder::put_along`]'s operands checked: the table's and
    /// the indices' types, the table's dimensions neither batch nor indexed (in order), and
    /// the type of what is taken (or put).
    fn along(
        &self,
        op: &'static str,
        table: Value,
        batch_dim: usize,
        index_dims: &[usize],
        indices: Value,
    ) -> Result<(TensorType, TensorType, Vec<usize>, TensorType)> {
        let tt = self.ty_of(op, table)?.clone();
        let ti = self.ty_of(op, indices)?.clone();
        if !ti.dtype().is_int() {
            return Err(dtype_err(op, format!("indices must be integers, got {ti}")));
        }
        let mut fixed = vec![batch_dim];
        fixed.extend_from_slice(index_dims);
        let n = index_dims.len();
        if n == 0 || !distinct_below(&fixed, tt.rank()) {
            return Err(shape_err(op, format!("batch {batch_dim}, index dims {index_dims:?} for {tt}")));
        }
        if ti.rank() < 2 || ti.dims()[ti.rank() - 1] != n || ti.dims()[0] != tt.dims()[batch_dim] {
            return Err(shape_err(op, format!("indices {ti} must be [{}, …, {n}] for {tt}", tt.dims()[batch_dim])));
        }
        let rest: Vec<usize> = (0..tt.rank()).filter(|d| !fixed.contains(d)).collect();
        let mut dims = ti.dims()[..ti.rank() - 1].to_vec();
        dims.extend(rest.iter().map(|&d| tt.dims()[d]));
        let taken = TensorType::new(tt.dtype(), &dims);
        Ok((tt, ti, rest, taken))
    }

    /// The `sizes`-shaped window of `a` starting at the scalar integer `starts` (one per
    /// dimension), each start clamped so the window fits (`stablehlo.dynamic_slice`).
    pub fn dynamic_slice(&mut self, a: Value, starts: &[Value], sizes: &[usize]) -> Result<Value> {
        let ta = self.ty_of("dynamic_slice", a)?.clone();
        self.check_starts("dynamic_slice", &ta, starts)?;
        if sizes.len() != ta.rank() || sizes.iter().zip(ta.dims()).any(|(s, d)| s > d) {
            return Err(shape_err("dynamic_slice", format!("window {sizes:?} does not fit {ta}")));
        }
        let out = TensorType::new(ta.dtype(), sizes);
        let names: Vec<&str> = starts.iter().map(|&v| self.name(v)).collect();
        let sty: Vec<String> = starts.iter().map(|&v| self.types[v.id].to_string()).collect();
        let line = format!(
            "\"stablehlo.dynamic_slice\"({}, {}) <{{slice_sizes = array<i64: {}>}}> : ({ta}, {}) -> {out}",
            self.name(a),
            names.join(", "),
            sizes.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
            sty.join(", "),
        );
        Ok(self.emit(line, out))
    }

    /// `a` with `update` written at the scalar integer `starts` (clamped so it fits)
    /// (`stablehlo.dynamic_update_slice`).
    pub fn dynamic_update_slice(&mut self, a: Value, update: Value, starts: &[Value]) -> Result<Value> {
        let ta = self.ty_of("dynamic_update_slice", a)?.clone();
        let tu = self.ty_of("dynamic_update_slice", update)?.clone();
        self.check_starts("dynamic_update_slice", &ta, starts)?;
        if tu.dtype() != ta.dtype() || tu.rank() != ta.rank() || tu.dims().iter().zip(ta.dims()).any(|(u, d)| u > d) {
            return Err(shape_err("dynamic_update_slice", format!("update {tu} does not fit {ta}")));
        }
        let names: Vec<&str> = starts.iter().map(|&v| self.name(v)).collect();
        let sty: Vec<String> = starts.iter().map(|&v| self.types[v.id].to_string()).collect();
        let line = format!(
            "stablehlo.dynamic_update_slice {}, {}, {} : ({ta}, {tu}, {}) -> {ta}",
            self.name(a),
            self.name(update),
            names.join(", "),
            sty.join(", "),
        );
        Ok(self.emit(line, ta))
    }

    fn check_starts(&self, op: &'static str, t: &TensorType, starts: &[Value]) -> Result<()> {
        if starts.len() != t.rank() {
            return Err(shape_err(op, format!("{} starts for {t}", starts.len())));
        }
        for &v in starts {
            let ts = self.ty_of(op, v)?;
            if ts.rank() != 0 || !ts.dtype().is_int() {
                return Err(dtype_err(op, format!("starts must be integer scalars, got {ts}")));
            }
        }
        Ok(())
    }

    /// `x` solving `a · x = b` for `a` lower triangular with an implied unit diagonal (its
    /// diagonal and upper triangle are not read), batched over the leading dimensions:
    /// `a [.., n, n]`, `b [.., n, m]` (`stablehlo.triangular_solve`, left side).
    pub fn solve_unit_lower(&mut self, a: Value, b: Value) -> Result<Value> {
        let ta = self.ty_of("triangular_solve", a)?.clone();
        let tb = self.ty_of("triangular_solve", b)?.clone();
        Kind::Float.check("triangular_solve", &ta)?;
        let (ra, rb) = (ta.rank(), tb.rank());
        let square = ra >= 2 && ta.dims()[ra - 1] == ta.dims()[ra - 2];
        if !square || rb != ra || tb.dtype() != ta.dtype() || tb.dims()[..rb - 1] != ta.dims()[..ra - 1] {
            return Err(shape_err("triangular_solve", format!("a {ta} and b {tb}")));
        }
        let line = format!(
            "\"stablehlo.triangular_solve\"({}, {}) {{left_side = true, lower = true, unit_diagonal = true, \
             transpose_a = #stablehlo<transpose NO_TRANSPOSE>}} : ({ta}, {tb}) -> {tb}",
            self.name(a),
            self.name(b),
        );
        Ok(self.emit(line, tb))
    }

    // ---------------------------------------------------------------- custom calls

    /// `stablehlo.custom_call @target(operands)` with one result of type `result`, as a typed
    /// XLA FFI call (`api_version = 4`): the plugin must have a handler registered as
    /// `target`, which checks the operands itself.
    pub fn custom_call(&mut self, target: &str, operands: &[Value], result: TensorType) -> Result<Value> {
        self.custom_call_at(target, operands, result, None)
    }

    /// [`Builder::custom_call`] with the op named `name` (`loc("name")`): XLA keeps the name
    /// as the instruction's `op_name`, so the compiled program says which call is which.
    pub fn custom_call_at(
        &mut self,
        target: &str,
        operands: &[Value],
        result: TensorType,
        name: Option<&str>,
    ) -> Result<Value> {
        let loc = location(name)?;
        if target.is_empty() || !target.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
            return Err(shape_err("custom_call", format!("target {target:?} is not a plain identifier")));
        }
        let types: Vec<String> =
            operands.iter().map(|&v| self.ty_of("custom_call", v).map(ToString::to_string)).collect::<Result<_>>()?;
        let names: Vec<&str> = operands.iter().map(|&v| self.name(v)).collect();
        let line = format!(
            "stablehlo.custom_call @{target}({}) {{api_version = 4 : i32}} : ({}) -> {result}{loc}",
            names.join(", "),
            types.join(", ")
        );
        Ok(self.emit(line, result))
    }

    /// `stablehlo.custom_call @target(operands)` of the older, untyped convention XLA's own
    /// library calls use (`api_version = 2`: cuDNN's `__cudnn$fmhaSoftmax`), with a
    /// `backend_config` string, row-major operand layouts and the given result layouts
    /// (`minor_to_major` per result); returns one value per result type. `name`, if any,
    /// names the op (`loc("name")`), as in [`Builder::custom_call_at`].
    pub fn library_call(
        &mut self,
        target: &str,
        operands: &[Value],
        results: &[TensorType],
        backend_config: &str,
        result_layouts: &[Vec<usize>],
        name: Option<&str>,
    ) -> Result<Vec<Value>> {
        let loc = location(name)?;
        let plain = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c == b'.';
        if target.is_empty() || !target.bytes().all(plain) {
            return Err(shape_err("library_call", format!("target {target:?} is not an identifier")));
        }
        if results.is_empty() || result_layouts.len() != results.len() {
            return Err(shape_err(
                "library_call",
                format!("{} results, {} layouts", results.len(), result_layouts.len()),
            ));
        }
        for (ty, layout) in results.iter().zip(result_layouts) {
            let mut sorted = layout.clone();
            sorted.sort_unstable();
            if sorted != (0..ty.rank()).collect::<Vec<_>>() {
                return Err(shape_err("library_call", format!("layout {layout:?} is not a permutation for {ty}")));
            }
        }
        let types: Vec<TensorType> =
            operands.iter().map(|&v| self.ty_of("library_call", v).cloned()).collect::<Result<_>>()?;
        let layout = |dims: &[usize]| match dims.len() {
            1 => format!("dense<{}> : tensor<1xindex>", dims[0]),
            n => format!(
                "dense<[{}]> : tensor<{n}xindex>",
                dims.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            ),
        };
        let row_major = |t: &TensorType| layout(&(0..t.rank()).rev().collect::<Vec<_>>());
        let names: Vec<&str> = operands.iter().map(|&v| self.name(v)).collect();
        let config = backend_config.replace('\\', "\\\\").replace('"', "\\\"");
        let line = format!(
            "stablehlo.custom_call @{target}({}) {{api_version = 2 : i32, backend_config = \"{config}\", \
             operand_layouts = [{}], result_layouts = [{}]}} : ({}) -> ({}){loc}",
            names.join(", "),
            types.iter().map(row_major).collect::<Vec<_>>().join(", "),
            result_layouts.iter().map(|l| layout(l)).collect::<Vec<_>>().join(", "),
            types.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
            results.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        );
        Ok(self.emit_many(line, results.to_vec()))
    }

    // ---------------------------------------------------------------- sort, loops

    /// `chlo.top_k`: the `k` largest of `a` (floats) along its last dimension, largest first,
    /// and their indices (i32); among equal values the lower index comes first (XLA's TopK).
    pub fn top_k(&mut self, a: Value, k: usize) -> Result<(Value, Value)> {
        let ta = self.ty_of("top_k", a)?.clone();
        let Some(&last) = ta.dims().last() else {
            return Err(shape_err("top_k", format!("{ta} has no last dimension")));
        };
        if k == 0 || k > last {
            return Err(shape_err("top_k", format!("k = {k} of {last} in {ta}")));
        }
        if !ta.dtype().is_float() {
            return Err(dtype_err("top_k", format!("{ta} is not a float")));
        }
        let mut dims = ta.dims().to_vec();
        *dims.last_mut().expect("a last dimension") = k;
        let (values, indices) = (TensorType::new(ta.dtype(), &dims), TensorType::new(DType::I32, &dims));
        let line = format!("chlo.top_k({}, k = {k}) : {ta} -> ({values}, {indices})", self.name(a));
        let out = self.emit_many(line, vec![values, indices]);
        Ok((out[0], out[1]))
    }

    /// Sorts `operands` (one shape) together along `dim`, ascending by the first, stably:
    /// equal keys keep their order. Returns the sorted operands.
    pub fn sort_by_first(&mut self, operands: &[Value], dim: usize) -> Result<Vec<Value>> {
        let types: Vec<TensorType> = operands.iter().map(|&v| self.ty_of("sort", v).cloned()).collect::<Result<_>>()?;
        let Some(key) = types.first() else {
            return Err(shape_err("sort", "nothing to sort".into()));
        };
        if dim >= key.rank() || types.iter().any(|t| t.dims() != key.dims()) {
            return Err(shape_err("sort", format!("dimension {dim} of operands {types:?}")));
        }
        let kind = match key.dtype() {
            d if d.is_float() => "FLOAT",
            d if d.is_int() => "SIGNED",
            _ => return Err(dtype_err("sort", format!("key {key} is not numeric"))),
        };
        let r = self.regions;
        self.regions += 1;
        let scalars: Vec<TensorType> = types.iter().map(|t| TensorType::scalar(t.dtype())).collect();
        let block_args: Vec<String> = scalars
            .iter()
            .enumerate()
            .flat_map(|(i, t)| [format!("%s{r}_{i}a: {t}"), format!("%s{r}_{i}b: {t}")])
            .collect();
        let names: Vec<&str> = operands.iter().map(|&v| self.name(v)).collect();
        let tys: Vec<String> = types.iter().map(ToString::to_string).collect();
        let s = &scalars[0];
        let line = format!(
            "\"stablehlo.sort\"({}) <{{dimension = {dim} : i64, is_stable = true}}> ({{\n    ^bb0({}):\n      %s{r}_lt = stablehlo.compare  LT, %s{r}_0a, %s{r}_0b,  {kind} : ({s}, {s}) -> tensor<i1>\n      stablehlo.return %s{r}_lt : tensor<i1>\n    }}) : ({}) -> ({})",
            names.join(", "),
            block_args.join(", "),
            tys.join(", "),
            tys.join(", "),
        );
        Ok(self.emit_many(line, types))
    }

    /// A `stablehlo.while` loop over the state `init`: `cond` gets the state and returns a
    /// scalar predicate, `body` gets it and returns the next state (the same types); the
    /// final state is returned. Both build regions that see only the state: a value from
    /// outside must be carried in it (using one is an error), and nothing built inside is
    /// usable after. On an error the body is left unchanged, as for the other ops.
    pub fn while_loop(
        &mut self,
        init: &[Value],
        cond: impl FnOnce(&mut Builder, &[Value]) -> Result<Value>,
        body: impl FnOnce(&mut Builder, &[Value]) -> Result<Vec<Value>>,
    ) -> Result<Vec<Value>> {
        let types: Vec<TensorType> = init.iter().map(|&v| self.ty_of("while", v).cloned()).collect::<Result<_>>()?;
        let names: Vec<String> = init.iter().map(|&v| self.name(v).to_string()).collect();
        let r = self.regions;
        self.regions += 1;
        let pred = [TensorType::scalar(DType::Pred)];
        let cond_text = self.region(&format!("c{r}"), &types, &pred, |b, state| Ok(vec![cond(b, state)?]))?;
        let body_text = self.region(&format!("w{r}"), &types, &types, body)?;
        let tys: Vec<String> = types.iter().map(ToString::to_string).collect();
        let tys = tys.join(", ");
        let line = format!(
            "\"stablehlo.while\"({}) ({{\n{cond_text}    }}, {{\n{body_text}    }}) : ({tys}) -> ({tys})",
            names.join(", ")
        );
        Ok(self.emit_many(line, types))
    }

    /// `sdy.manual_computation` over every axis of the builder's mesh (what JAX's
    /// `shard_map` lowers to): `body` gets each operand's part on one device — its dims divided
    /// by the axes its `in_specs` entry splits them over — and returns each result's part,
    /// which `out_specs` assemble into the results; nothing is partitioned inside, so a library
    /// call without a sharding rule runs on each device's part as it is. An operand not split
    /// over an axis is whole on each of its devices; a result not split over one must be the
    /// same on all of them. Values from outside are passed in as operands (using one is an
    /// error); the body's results must split evenly.
    pub fn manual_computation(
        &mut self,
        operands: &[Value],
        in_specs: &[PartitionSpec],
        out_specs: &[PartitionSpec],
        body: impl FnOnce(&mut Builder, &[Value]) -> Result<Vec<Value>>,
    ) -> Result<Vec<Value>> {
        let mesh = self.mesh.clone().ok_or_else(|| HloError::NoMesh("manual_computation".into()))?;
        if operands.len() != in_specs.len() || out_specs.is_empty() {
            return Err(shape_err(
                "manual_computation",
                format!("{} operands with {} specs, {} result specs", operands.len(), in_specs.len(), out_specs.len()),
            ));
        }
        let globals: Vec<TensorType> =
            operands.iter().map(|&v| self.ty_of("manual_computation", v).cloned()).collect::<Result<_>>()?;
        let mut locals = Vec::with_capacity(globals.len());
        for (i, (ty, spec)) in globals.iter().zip(in_specs).enumerate() {
            let what = format!("manual_computation operand {i} {ty}");
            let dims = spec.shard_shape(ty.dims(), &mesh).map_err(|source| HloError::Sharding { what, source })?;
            locals.push(TensorType::new(ty.dtype(), &dims));
        }
        let r = self.regions;
        self.regions += 1;
        let block = self.block(&format!("m{r}"), &locals, body)?;
        if block.results.len() != out_specs.len() {
            return Err(shape_err(
                "manual_computation",
                format!("the body returns {} values for {} result specs", block.results.len(), out_specs.len()),
            ));
        }
        let mut results = Vec::with_capacity(out_specs.len());
        for (ty, spec) in block.results.iter().zip(out_specs) {
            if spec.dims().len() != ty.rank() {
                return Err(shape_err("manual_computation", format!("result spec {spec} for {ty}")));
            }
            let dims: Vec<usize> =
                ty.dims().iter().zip(spec.dims()).map(|(&d, axes)| d * spec_ways(axes, &mesh)).collect();
            results.push(TensorType::new(ty.dtype(), &dims));
        }
        let specs = |specs: &[PartitionSpec]| specs.iter().map(sharding_body).collect::<Vec<_>>().join(", ");
        let axes: Vec<String> = mesh.axes().iter().map(|a| format!("\"{}\"", a.name)).collect();
        let names: Vec<&str> = operands.iter().map(|&v| self.name(v)).collect();
        let tys = |t: &[TensorType]| t.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
        let line = format!(
            "sdy.manual_computation({}) in_shardings=[{}] out_shardings=[{}] manual_axes={{{}}} ({}) {{\n{}      \
             sdy.return {} : {}\n    }} : ({}) -> ({})",
            names.join(", "),
            specs(in_specs),
            specs(out_specs),
            axes.join(", "),
            block.params,
            block.body,
            block.returned,
            block.result_types(),
            tys(&globals),
            tys(&results),
        );
        Ok(self.emit_many(line, results))
    }

    // ---------------------------------------------------------------- finish

    /// Returns `results` (no result shardings) and prints the module.
    pub fn finish(self, results: &[Value]) -> Result<String> {
        let with: Vec<(Value, Option<PartitionSpec>)> = results.iter().map(|&v| (v, None)).collect();
        self.finish_sharded(&with)
    }

    /// Returns `results`, each with an optional partition spec (only with a mesh), and
    /// prints the module.
    pub fn finish_sharded(self, results: &[(Value, Option<PartitionSpec>)]) -> Result<String> {
        if results.is_empty() {
            return Err(HloError::NoResults(self.name.clone()));
        }
        for (i, (v, spec)) in results.iter().enumerate() {
            let ty = self.ty_of("return", *v)?;
            if let Some(spec) = spec {
                self.check_spec(&format!("result {i} {ty}"), spec, ty.dims(), true)?;
            }
        }
        for &(position, result) in &self.donated {
            let arg = &self.types[self.args[position].0];
            match results.get(result) {
                Some((v, _)) if self.types[v.id] == *arg => {}
                Some((v, _)) => {
                    let what = format!("argument {position} {arg} donated to result {result} {}", self.types[v.id]);
                    return Err(shape_err("donate", what));
                }
                None => return Err(shape_err("donate", format!("result {result} of {}", results.len()))),
            }
        }
        let mut out = String::new();
        let w = &mut out;
        let _ = writeln!(w, "module @{} {{", self.name);
        if let Some(mesh) = &self.mesh {
            let axes: Vec<String> = mesh.axes().iter().map(|a| format!("\"{}\"={}", a.name, a.size)).collect();
            let _ = writeln!(w, "  sdy.mesh @mesh = <[{}]>", axes.join(", "));
        }
        let args: Vec<String> = self
            .args
            .iter()
            .enumerate()
            .map(|(position, (id, spec))| {
                let donated = self.donated.iter().find(|(a, _)| *a == position).map(|(_, r)| *r);
                format!("{}: {}{}", self.names[*id], self.types[*id], arg_attrs(spec.as_ref(), donated))
            })
            .collect();
        let res_types: Vec<String> =
            results.iter().map(|(v, spec)| format!("{}{}", self.types[v.id], sharding_attr(spec.as_ref()))).collect();
        let _ = writeln!(w, "  func.func public @main({}) -> ({}) {{", args.join(", "), res_types.join(", "));
        w.push_str(&self.body);
        let names: Vec<&str> = results.iter().map(|(v, _)| self.name(*v)).collect();
        let tys: Vec<String> = results.iter().map(|(v, _)| self.types[v.id].to_string()).collect();
        let _ = writeln!(w, "    return {} : {}", names.join(", "), tys.join(", "));
        let _ = writeln!(w, "  }}");
        let _ = writeln!(w, "}}");
        Ok(out)
    }

    // ---------------------------------------------------------------- internals

    fn check(&self, op: &'static str, v: Value) -> Result<()> {
        if v.builder != self.id || v.id >= self.types.len() {
            return Err(foreign(op, v));
        }
        if self.floors.last().is_some_and(|&floor| v.id < floor) || self.closed.iter().any(|r| r.contains(&v.id)) {
            return Err(HloError::OutOfScope { op, id: v.id });
        }
        Ok(())
    }

    fn ty_of(&self, op: &'static str, v: Value) -> Result<&TensorType> {
        self.check(op, v)?;
        Ok(&self.types[v.id])
    }

    fn name(&self, v: Value) -> &str {
        &self.names[v.id]
    }

    fn push_value(&mut self, name: String, ty: TensorType) -> Value {
        self.types.push(ty);
        self.names.push(name);
        Value { builder: self.id, id: self.types.len() - 1 }
    }

    /// Appends `%N = line` to the body and returns `%N`.
    fn emit(&mut self, line: String, ty: TensorType) -> Value {
        let name = format!("%{}", self.types.len());
        let _ = writeln!(self.body, "    {name} = {line}");
        self.push_value(name, ty)
    }

    /// Appends `%N:k = line` (an op with one result per type) and returns `%N#0…`.
    fn emit_many(&mut self, line: String, types: Vec<TensorType>) -> Vec<Value> {
        let name = format!("%{}", self.types.len());
        let _ = writeln!(self.body, "    {name}:{} = {line}", types.len());
        types.into_iter().enumerate().map(|(i, ty)| self.push_value(format!("{name}#{i}"), ty)).collect()
    }

    /// Builds a region's block (`^bb0(args): … return`) with `f` on block arguments of
    /// `args`, checking that it returns values of `results`; returns its text.
    fn region(
        &mut self,
        prefix: &str,
        args: &[TensorType],
        results: &[TensorType],
        f: impl FnOnce(&mut Builder, &[Value]) -> Result<Vec<Value>>,
    ) -> Result<String> {
        let block = self.block(prefix, args, f)?;
        if block.results != results {
            return Err(shape_err("region", format!("returns {:?}, must return {results:?}", block.results)));
        }
        Ok(format!(
            "    ^bb0({}):\n{}      \"stablehlo.return\"({}) : ({}) -> ()\n",
            block.params,
            block.body,
            block.returned,
            block.result_types()
        ))
    }

    /// Builds a block with `f` on arguments of `args`, values of the builder outside it out of
    /// its reach and its own out of reach after it: its parameters, body and returned values.
    fn block(
        &mut self,
        prefix: &str,
        args: &[TensorType],
        f: impl FnOnce(&mut Builder, &[Value]) -> Result<Vec<Value>>,
    ) -> Result<Block> {
        let outer = std::mem::take(&mut self.body);
        let floor = self.types.len();
        let vals: Vec<Value> =
            args.iter().enumerate().map(|(i, t)| self.push_value(format!("%{prefix}_{i}"), t.clone())).collect();
        self.floors.push(floor);
        let built = f(self, &vals).and_then(|out| {
            let types: Vec<TensorType> =
                out.iter().map(|&v| self.ty_of("region", v).cloned()).collect::<Result<_>>()?;
            Ok((out, types))
        });
        self.floors.pop();
        self.closed.push(floor..self.types.len());
        let body = std::mem::replace(&mut self.body, outer);
        let (out, results) = built?;
        let params: Vec<String> = vals.iter().zip(args).map(|(v, t)| format!("{}: {t}", self.name(*v))).collect();
        let names: Vec<&str> = out.iter().map(|&v| self.name(v)).collect();
        Ok(Block { params: params.join(", "), body, returned: names.join(", "), results })
    }

    fn check_spec(&self, what: &str, spec: &PartitionSpec, dims: &[usize], divisible: bool) -> Result<()> {
        let mesh = self.mesh.as_ref().ok_or_else(|| HloError::NoMesh(what.to_string()))?;
        match spec.shard_shape(dims, mesh) {
            Ok(_) => Ok(()),
            // Shardy pads uneven splits of intermediates; only buffers that cross the
            // host boundary must split evenly.
            Err(MeshError::NotDivisible { .. }) if !divisible => Ok(()),
            Err(source) => Err(HloError::Sharding { what: what.to_string(), source }),
        }
    }

    fn binary(&mut self, op: &'static str, a: Value, b: Value, kind: Kind) -> Result<Value> {
        let ta = self.ty_of(op, a)?.clone();
        let tb = self.ty_of(op, b)?.clone();
        if ta != tb {
            return Err(mismatch(op, &ta, &tb));
        }
        kind.check(op, &ta)?;
        let line = format!("stablehlo.{op} {}, {} : {ta}", self.name(a), self.name(b));
        Ok(self.emit(line, ta))
    }

    fn unary(&mut self, op: &'static str, a: Value, kind: Kind) -> Result<Value> {
        let ta = self.ty_of(op, a)?.clone();
        kind.check(op, &ta)?;
        let line = format!("stablehlo.{op} {} : {ta}", self.name(a));
        Ok(self.emit(line, ta))
    }

    fn reduce(&mut self, op: &'static str, init: f64, a: Value, dims: &[usize]) -> Result<Value> {
        let ta = self.ty_of("reduce", a)?.clone();
        Kind::Numeric.check("reduce", &ta)?;
        if !distinct_below(dims, ta.rank()) {
            return Err(shape_err("reduce", format!("bad dimensions {dims:?} for {ta}")));
        }
        let mut sorted = dims.to_vec();
        sorted.sort_unstable();
        let out_dims: Vec<usize> = (0..ta.rank()).filter(|d| !sorted.contains(d)).map(|d| ta.dims()[d]).collect();
        let out = TensorType::new(ta.dtype(), &out_dims);
        let scalar = TensorType::scalar(ta.dtype());
        let init_v = self.splat(init, scalar.clone())?;
        let r = self.regions;
        self.regions += 1;
        let line = format!(
            "stablehlo.reduce({} init: {}) across dimensions = {} : ({ta}, {scalar}) -> {out}\n     reducer(%r{r}_a: {scalar}, %r{r}_b: {scalar})  {{\n      %r{r}_c = stablehlo.{op} %r{r}_a, %r{r}_b : {scalar}\n      stablehlo.return %r{r}_c : {scalar}\n    }}",
            self.name(a),
            self.name(init_v),
            list(&sorted)
        );
        Ok(self.emit(line, out))
    }
}

/// Which dtypes an elementwise op accepts.
#[derive(Clone, Copy)]
enum Kind {
    Numeric,
    Float,
    IntOrPred,
}

impl Kind {
    fn check(self, op: &'static str, t: &TensorType) -> Result<()> {
        let d = t.dtype();
        let ok = match self {
            Kind::Numeric => d != DType::Pred,
            Kind::Float => d.is_float(),
            Kind::IntOrPred => d.is_int() || d == DType::Pred,
        };
        if ok {
            Ok(())
        } else {
            let want = match self {
                Kind::Numeric => "a numeric type",
                Kind::Float => "a floating-point type",
                Kind::IntOrPred => "an integer or predicate type",
            };
            Err(dtype_err(op, format!("{t} is not {want}")))
        }
    }
}

/// A block [`Builder::block`] built: its parameters, body text, the names it returns and their
/// types.
struct Block {
    params: String,
    body: String,
    returned: String,
    results: Vec<TensorType>,
}

impl Block {
    fn result_types(&self) -> String {
        self.results.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    }
}

/// How many parts the mesh axes `axes` split a dimension into.
fn spec_ways(axes: &[String], mesh: &Mesh) -> usize {
    axes.iter().map(|a| mesh.axis_size(a).unwrap_or(1)).product()
}

/// ` loc("name")` for an op named `name` (nothing for `None`); a name is letters, digits and
/// `._-/`, so that it needs no escaping.
fn location(name: Option<&str>) -> Result<String> {
    match name {
        None => Ok(String::new()),
        Some(n) if !n.is_empty() && n.bytes().all(|c| c.is_ascii_alphanumeric() || b"._-/".contains(&c)) => {
            Ok(format!(" loc(\"{n}\")"))
        }
        Some(n) => Err(shape_err("loc", format!("op name {n:?} is not letters, digits and ._-/"))),
    }
}

fn shape_err(op: &'static str, detail: String) -> HloError {
    HloError::Shape { op, detail }
}

fn dtype_err(op: &'static str, detail: String) -> HloError {
    HloError::DType { op, detail }
}

fn foreign(op: &'static str, v: Value) -> HloError {
    HloError::ForeignValue { op, id: v.id }
}

fn mismatch(op: &'static str, a: &TensorType, b: &TensorType) -> HloError {
    if a.dtype() != b.dtype() {
        dtype_err(op, format!("operand types differ: {a} vs {b}"))
    } else {
        shape_err(op, format!("operand shapes differ: {a} vs {b} (broadcast explicitly)"))
    }
}

fn list(xs: &[usize]) -> String {
    format!("[{}]", xs.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

fn distinct_below(xs: &[usize], rank: usize) -> bool {
    xs.iter().enumerate().all(|(i, &x)| x < rank && !xs[..i].contains(&x))
}

fn is_permutation(perm: &[usize], rank: usize) -> bool {
    perm.len() == rank && distinct_below(perm, rank)
}

/// `<@mesh, [{"data"}, {}]>`
fn sharding_body(spec: &PartitionSpec) -> String {
    let dims: Vec<String> = spec
        .dims()
        .iter()
        .map(|axes| format!("{{{}}}", axes.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ")))
        .collect();
    format!("<@mesh, [{}]>", dims.join(", "))
}

/// An argument's attributes: its sharding and the result it is donated to, if any.
fn arg_attrs(spec: Option<&PartitionSpec>, donated: Option<usize>) -> String {
    let Some(result) = donated else { return sharding_attr(spec) };
    match spec {
        Some(spec) => {
            format!(" {{sdy.sharding = #sdy.sharding{}, tf.aliasing_output = {result} : i32}}", sharding_body(spec))
        }
        None => format!(" {{tf.aliasing_output = {result} : i32}}"),
    }
}

fn sharding_attr(spec: Option<&PartitionSpec>) -> String {
    match spec {
        Some(spec) => format!(" {{sdy.sharding = #sdy.sharding{}}}", sharding_body(spec)),
        None => String::new(),
    }
}

/// The literal of a splat constant. Floats are written as hex bit patterns so that the
/// value in the program is exactly the rounded one (and infinities need no spelling).
fn scalar_literal(value: f64, dtype: DType) -> String {
    match dtype {
        DType::Pred => (if value != 0.0 { "true" } else { "false" }).to_string(),
        DType::F64 => format!("0x{:016X}", value.to_bits()),
        DType::F32 => format!("0x{:08X}", (value as f32).to_bits()),
        DType::BF16 => format!("0x{:04X}", half::bf16::from_f64(value).to_bits()),
        DType::F16 => format!("0x{:04X}", half::f16::from_f64(value).to_bits()),
        DType::F8E4M3FN => format!("0x{:02X}", crate::types::e4m3fn_bits(value)),
        DType::I8 => (value as i8).to_string(),
        DType::U8 => (value as u8).to_string(),
        DType::I32 => (value as i32).to_string(),
        DType::I64 => (value as i64).to_string(),
    }
}
