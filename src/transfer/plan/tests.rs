//! The plan as a pure function: a table of header entries, requests and
//! options in, routes out (no file, no device except for a lent buffer).

use std::path::{Path, PathBuf};

use super::*;
use crate::dtype::DType;
use crate::fallback::Failure;

/// A one-shard checkpoint's header, laid out back to back.
struct Table {
    path: PathBuf,
    infos: Vec<TensorInfo>,
}

/// The data section's offset in the table's file.
const DATA: u64 = 4096;

impl Table {
    fn new(tensors: &[(&str, DType, &[u64])]) -> Table {
        let mut at = 0u64;
        let infos = tensors
            .iter()
            .map(|&(name, dtype, shape)| {
                let elems: u64 = shape.iter().product();
                let bytes = dtype.bytes_for(elems).unwrap_or(0);
                let info = TensorInfo {
                    name: name.into(),
                    dtype,
                    shape: shape.to_vec(),
                    data_offsets: (at, at + bytes),
                };
                at += bytes;
                info
            })
            .collect();
        Table {
            path: PathBuf::from("m.safetensors"),
            infos,
        }
    }
}

impl Catalog for Table {
    fn path(&self) -> &Path {
        &self.path
    }

    fn find(&self, name: &str) -> Option<Stored<'_>> {
        let info = self.infos.iter().find(|i| i.name == name)?;
        Some(Stored {
            shard: 0,
            path: &self.path,
            data_start: DATA,
            info,
        })
    }
}

fn model() -> Table {
    Table::new(&[
        ("w", DType::BF16, &[64, 64]),   // 8 KiB, device kernel to f32
        ("d", DType::F64, &[16, 4]),     // 512 B, CPU-only to f32
        ("ids", DType::I32, &[100]),     // never converted
        ("empty", DType::BF16, &[0, 8]), // no bytes
        ("s", DType::F32, &[]),          // a scalar
    ])
}

fn plan(t: &Table, names: &[&str], opts: &LoadOptions, staging: u64) -> Result<Plan> {
    let reqs: Vec<Request> = names.iter().map(|n| Request::whole(*n)).collect();
    Plan::new(t, &reqs, opts, staging, Vec::new())
}

fn to_f32() -> LoadOptions {
    LoadOptions::to_dtype(DType::F32)
}

fn routes(p: &Plan) -> Vec<Route> {
    p.steps.iter().map(Step::route).collect()
}

/// Each request's file range, dtypes, shape and output bytes: floats
/// converted to the asked dtype, other dtypes as stored; rows of a tensor
/// are a narrower range and a shorter first dimension.
#[test]
fn items_are_the_requested_ranges() {
    let t = model();
    let reqs = [
        Request::whole("w"),
        Request::rows("w", 8..24),
        Request::whole("ids"),
        Request::whole("d"),
    ];
    let p = Plan::new(&t, &reqs, &to_f32(), 0, Vec::new()).unwrap();
    let w = &p.items[0];
    assert_eq!((w.file_off, w.src_bytes, w.out_bytes), (DATA, 8192, 16384));
    assert_eq!(
        (w.dtype, w.out_dtype, w.shape.as_slice()),
        (DType::BF16, DType::F32, &[64u64, 64][..])
    );
    assert_eq!(
        w.op.map(|o| (o.from, o.to)),
        Some((DType::BF16, DType::F32))
    );
    let rows = &p.items[1];
    assert_eq!(
        (rows.file_off, rows.src_bytes, rows.out_bytes),
        (DATA + 8 * 128, 16 * 128, 16 * 256)
    );
    assert_eq!(rows.shape, [16, 64]);
    let ids = &p.items[2];
    assert_eq!(
        (ids.out_dtype, ids.out_bytes, ids.op),
        (DType::I32, 400, None)
    );
    assert_eq!(ids.file_off, DATA + 8192 + 512);
    assert_eq!(
        (p.items[3].out_dtype, p.items[3].out_bytes),
        (DType::F32, 256)
    );
    assert_eq!(p.file_bytes(), 8192 + 2048 + 400 + 512);
    // As stored: nothing converts.
    let p = plan(&t, &["w", "d"], &LoadOptions::default(), 0).unwrap();
    assert!(p
        .items
        .iter()
        .all(|i| i.op.is_none() && i.out_bytes == i.src_bytes));
}

/// A missing tensor, rows of a scalar, rows past the end or backwards:
/// each is its error, naming the tensor.
#[test]
fn bad_requests_are_errors() {
    let t = model();
    let opts = to_f32();
    let e = plan(&t, &["w", "nope"], &opts, 0).unwrap_err();
    assert!(
        matches!(&e, Error::TensorNotFound { tensor, .. } if tensor == "nope"),
        "{e}"
    );
    let one = |r: Request| Plan::new(&t, &[r], &opts, 0, Vec::new()).unwrap_err();
    assert!(matches!(one(Request::rows("s", 0..1)), Error::NoRows { tensor, .. } if tensor == "s"));
    assert!(matches!(
        one(Request::rows("w", 0..65)),
        Error::RowRange {
            end: 65,
            rows: 64,
            ..
        }
    ));
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = Request::rows("w", 9..3);
    assert!(matches!(
        one(backwards),
        Error::RowRange {
            start: 9,
            end: 3,
            ..
        }
    ));
}

/// A slice of a later dimension: runs of the slice's bytes, one per index
/// of the dimensions before it, `stride` apart; the shape narrows that
/// dimension. A slice that is one range in the file (the first dimension,
/// all of the dimension, or nothing before it) has no runs.
#[test]
fn slices_of_later_dimensions_are_runs() {
    let t = Table::new(&[
        ("w", DType::BF16, &[64, 64]),
        ("c", DType::F32, &[2, 3, 8, 4]),
        ("v", DType::BF16, &[1, 40]),
        ("z", DType::BF16, &[4, 6, 0]),
    ]);
    let reqs = [
        Request::slice("w", 1, 16..48),
        Request::slice("c", 2, 2..5),
        Request::slice("w", 1, 0..64),
        Request::slice("v", 1, 8..24),
        Request::slice("c", 3, 1..2),
        Request::slice("w", 1, 5..5),
        Request::slice("z", 1, 2..5),
    ];
    let p = Plan::new(&t, &reqs, &to_f32(), 0, Vec::new()).unwrap();
    let w = &p.items[0];
    assert_eq!(w.shape, [64, 32]);
    assert_eq!(
        (w.file_off, w.src_bytes, w.out_bytes),
        (DATA + 32, 64 * 64, 64 * 128)
    );
    assert_eq!(
        w.runs,
        Some(Runs {
            run: 64,
            stride: 128
        })
    );
    // The file offset of each source byte: run k at file_off + k * stride.
    assert_eq!(w.file_at(0), DATA + 32);
    assert_eq!(w.file_at(63), DATA + 32 + 63);
    assert_eq!(w.file_at(64), DATA + 32 + 128);
    assert_eq!(w.file_at(64 * 63 + 1), DATA + 32 + 128 * 63 + 1);
    let c = &p.items[1];
    let c_at = DATA + 8192;
    assert_eq!(c.shape, [2, 3, 3, 4]);
    assert_eq!((c.file_off, c.src_bytes), (c_at + 2 * 16, 6 * 3 * 16));
    assert_eq!(
        c.runs,
        Some(Runs {
            run: 48,
            stride: 128
        })
    );
    // All of dimension 1: the whole tensor, one range.
    let all = &p.items[2];
    assert_eq!((all.file_off, all.src_bytes, all.runs), (DATA, 8192, None));
    assert_eq!(all.shape, [64, 64]);
    // Nothing before dimension 1 but a 1: one range.
    let v = &p.items[3];
    let v_at = c_at + 2 * 3 * 8 * 4 * 4;
    assert_eq!((v.file_off, v.src_bytes, v.runs), (v_at + 16, 32, None));
    assert_eq!(v.shape, [1, 16]);
    // The last dimension: runs of one element.
    let last = &p.items[4];
    assert_eq!(last.runs, Some(Runs { run: 4, stride: 16 }));
    assert_eq!(
        (last.file_off, last.src_bytes, last.shape.as_slice()),
        (c_at + 4, 48 * 4, &[2u64, 3, 8, 1][..])
    );
    // Empty: no bytes, no runs.
    let empty = &p.items[5];
    assert_eq!((empty.src_bytes, empty.out_bytes, empty.runs), (0, 0, None));
    assert_eq!(empty.shape, [64, 0]);
    // A zero dimension after the slice's: no bytes, no runs (a run of zero
    // bytes would divide by zero).
    let z = &p.items[6];
    assert_eq!(
        (z.src_bytes, z.runs, z.shape.as_slice()),
        (0, None, &[4u64, 3, 0][..])
    );
    assert_eq!(p.ring_items(), vec![0, 1, 2, 3, 4]);
}

/// A slice of a dimension the tensor lacks, or past its length, is its
/// error, naming the tensor.
#[test]
fn bad_slices_are_errors() {
    let t = model();
    let one = |r: Request| Plan::new(&t, &[r], &to_f32(), 0, Vec::new()).unwrap_err();
    assert!(matches!(
        one(Request::slice("w", 2, 0..1)),
        Error::SliceDim { dim: 2, ref tensor, ref shape, .. } if tensor == "w" && shape == &[64, 64]
    ));
    assert!(matches!(
        one(Request::slice("s", 0, 0..1)),
        Error::NoRows { .. }
    ));
    assert!(matches!(
        one(Request::slice("s", 1, 0..1)),
        Error::SliceDim { dim: 1, .. }
    ));
    assert!(matches!(
        one(Request::slice("d", 1, 2..5)),
        Error::RowRange {
            start: 2,
            end: 5,
            rows: 4,
            ..
        }
    ));
    let e = one(Request::slice("w", 3, 0..1));
    assert!(e.to_string().contains("has no dimension 3 to slice"), "{e}");
}

/// By default every tensor goes through the ring, except a conversion
/// without a device kernel (the CPU rung, routed there, nothing failed);
/// under `Forbid` that missing kernel is the first rung's failure.
#[test]
fn routes_follow_kernels_and_fallback() {
    let t = model();
    let p = plan(&t, &["w", "d", "ids"], &to_f32(), 0).unwrap();
    assert_eq!(
        routes(&p),
        [Route::Ring, Route::Ladder(Rung::CpuConvert), Route::Ring]
    );
    let d = &p.steps[1];
    assert!(d.attempts.is_empty());
    assert_eq!(
        d.routed.as_deref(),
        Some("no device kernel for f64->f32: converted on the CPU")
    );
    assert!(p.steps[0].routed.is_none() && p.steps[0].attempts.is_empty());

    let forbid = LoadOptions {
        fallback: Fallback::Forbid,
        ..to_f32()
    };
    let p = plan(&t, &["d"], &forbid, 0).unwrap();
    assert_eq!(routes(&p), [Route::Ladder(Rung::CpuConvert)]);
    let a = &p.steps[0].attempts;
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].step, Rung::PinnedRing);
    assert!(matches!(
        a[0].failure,
        Failure::NoTrustedKernel {
            from: DType::F64,
            to: DType::F32
        }
    ));
    assert!(p.steps[0].routed.is_none());
}

/// A forced rung is every tensor's start, said why; a forced device rung
/// still sends a conversion without a kernel to the CPU.
#[test]
fn forced_rungs() {
    let t = model();
    let force = |r| LoadOptions {
        fallback: Fallback::Force(r),
        ..to_f32()
    };
    let p = plan(&t, &["w", "ids"], &force(Rung::Pageable), 0).unwrap();
    assert_eq!(routes(&p), [Route::Ladder(Rung::Pageable); 2]);
    assert_eq!(p.steps[0].routed.as_deref(), Some("forced: pageable"));
    assert!(!p.ring_early);
    let p = plan(&t, &["w", "d"], &force(Rung::SmallChunks), 0).unwrap();
    assert_eq!(
        routes(&p),
        [
            Route::Ladder(Rung::SmallChunks),
            Route::Ladder(Rung::CpuConvert)
        ]
    );
    let p = plan(&t, &["w"], &force(Rung::PinnedRing), 0).unwrap();
    assert_eq!(
        (routes(&p), p.steps[0].routed.is_none()),
        (vec![Route::Ring], true)
    );
    assert!(p.ring_early);
    let p = plan(&t, &["w", "d"], &force(Rung::KeepOnHost), 0).unwrap();
    assert_eq!(routes(&p), [Route::Ladder(Rung::KeepOnHost); 2]);
}

/// The budget counts the staging first, then the outputs in request
/// order; what does not fit is offloaded, nothing tried (a `Forbid`
/// failure planned before is dropped). A tensor kept on the host by choice
/// takes nothing; a later smaller tensor may still fit.
#[test]
fn budget_offloads_in_request_order() {
    let t = model();
    let with = |b| LoadOptions {
        memory_budget: Some(b),
        fallback: Fallback::Forbid,
        ..to_f32()
    };
    // 16 KiB (w) + 256 (d) + 400 (ids) after 1000 of staging.
    let p = plan(
        &t,
        &["w", "d", "ids"],
        &with(1000 + 16384 + 256 + 400),
        1000,
    )
    .unwrap();
    assert_eq!(
        routes(&p),
        [Route::Ring, Route::Ladder(Rung::CpuConvert), Route::Ring]
    );
    assert_eq!(
        p.steps[1].attempts.len(),
        1,
        "Forbid: the missing kernel failed"
    );
    assert!(!p.ring_early, "no early ring under a budget");
    // The 400 bytes do not fit, the 256 after them do.
    let p = plan(&t, &["w", "ids", "d"], &with(1000 + 16384 + 300), 1000).unwrap();
    assert_eq!(
        routes(&p),
        [
            Route::Ring,
            Route::Offloaded,
            Route::Ladder(Rung::CpuConvert)
        ]
    );
    assert!(p.steps[1].attempts.is_empty() && p.steps[1].start == Rung::KeepOnHost);
    // Offloaded: the failure planned under Forbid is dropped.
    let p = plan(&t, &["w", "d"], &with(1000 + 100), 1000).unwrap();
    assert_eq!(routes(&p), [Route::Offloaded; 2]);
    assert!(p.steps[1].attempts.is_empty() && p.steps[1].offloaded);
    // Below the staging: everything stays on the host.
    let p = plan(&t, &["w", "d", "ids"], &with(999), 1000).unwrap();
    assert_eq!(routes(&p), [Route::Offloaded; 3]);
    // Kept on the host by choice: not offloaded, counts nothing.
    let keep = LoadOptions {
        fallback: Fallback::Force(Rung::KeepOnHost),
        ..with(0)
    };
    let p = plan(&t, &["w"], &keep, 1000).unwrap();
    assert_eq!(routes(&p), [Route::Ladder(Rung::KeepOnHost)]);
    assert!(!p.steps[0].offloaded);
}

/// An output the caller lends is carried in the plan, never offloaded
/// and not counted; the other tensors are budgeted as before.
#[test]
fn lent_outputs_are_carried_and_not_budgeted() {
    let t = model();
    let dev = crate::device::Device::host();
    let lent = dev.stream().unwrap().alloc::<u8>(16384).unwrap();
    let opts = LoadOptions {
        memory_budget: Some(100 + 256),
        ..to_f32()
    };
    let reqs = [
        Request::whole("w"),
        Request::whole("d"),
        Request::whole("ids"),
    ];
    let p = Plan::new(&t, &reqs, &opts, 100, vec![Some(lent)]).unwrap();
    assert_eq!(
        routes(&p),
        [
            Route::Ring,
            Route::Ladder(Rung::CpuConvert),
            Route::Offloaded
        ]
    );
    assert_eq!(p.steps[0].lent.as_ref().map(|b| b.len()), Some(16384));
    assert!(p.steps[1].lent.is_none() && p.steps[2].lent.is_none());
}

/// The self-test's verdict moves an untrusted device conversion to the
/// CPU rung with the missing kernel as the first failure; trusted ones,
/// conversions already on the CPU and offloaded tensors stay.
#[test]
fn trust_applies_the_self_test() {
    let t = model();
    let mut p = plan(&t, &["w", "d", "ids"], &to_f32(), 0).unwrap();
    assert!(p.self_test);
    p.trust(|_| true);
    assert_eq!(
        routes(&p),
        [Route::Ring, Route::Ladder(Rung::CpuConvert), Route::Ring]
    );
    p.trust(|op| op.from != DType::BF16);
    let cpu = Route::Ladder(Rung::CpuConvert);
    assert_eq!(routes(&p), [cpu, cpu, Route::Ring]);
    let a = &p.steps[0].attempts;
    assert_eq!(a.len(), 1);
    assert!(matches!(
        a[0].failure,
        Failure::NoTrustedKernel {
            from: DType::BF16,
            to: DType::F32
        }
    ));
    assert!(p.steps[1].attempts.is_empty());

    let budget = LoadOptions {
        memory_budget: Some(0),
        ..to_f32()
    };
    let mut p = plan(&t, &["w"], &budget, 0).unwrap();
    p.trust(|_| false);
    assert_eq!(routes(&p), [Route::Offloaded]);
    assert!(p.steps[0].attempts.is_empty());
}

/// The self-test is due only when asked for and some tensor converts with
/// a device kernel; the ring starts early only when it has bytes to move.
#[test]
fn self_test_and_early_ring() {
    let t = model();
    assert!(!plan(&t, &["d", "ids"], &to_f32(), 0).unwrap().self_test);
    assert!(
        !plan(&t, &["w"], &LoadOptions::default(), 0)
            .unwrap()
            .self_test
    );
    let off = LoadOptions {
        self_test: false,
        ..to_f32()
    };
    assert!(!plan(&t, &["w"], &off, 0).unwrap().self_test);
    let p = plan(&t, &["empty"], &to_f32(), 0).unwrap();
    assert!(!p.ring_early && p.ring_items().is_empty());
    let p = plan(&t, &["empty", "d", "w", "ids"], &to_f32(), 0).unwrap();
    assert!(p.ring_early);
    assert_eq!(p.ring_items(), [2, 3]);
}

fn sized(bytes: &[u64]) -> Vec<Item> {
    bytes
        .iter()
        .map(|&b| Item {
            name: String::new(),
            source: 0,
            file_off: 0,
            src_bytes: b,
            dtype: DType::U8,
            out_dtype: DType::U8,
            shape: vec![b],
            out_bytes: b,
            op: None,
            runs: None,
        })
        .collect()
}

/// Jobs are filled densely: pieces aligned to 256 bytes, a tensor that
/// does not fit split at a multiple of 64 KiB, a new job when the slot or
/// its piece count is full; every byte of every ring tensor once.
#[test]
fn pack_fills_slots_densely() {
    let cap = 4 * SPLIT_ALIGN;
    let s = SPLIT_ALIGN;
    let items = sized(&[100, 4 * s as u64 + 5, 2 * s as u64, 7]);
    let jobs = pack(&items, &[0, 1, 2, 3], cap);
    let pieces: Vec<Vec<(usize, u64, usize, usize)>> = jobs
        .iter()
        .map(|j| {
            j.pieces
                .iter()
                .map(|p| (p.item, p.src_off, p.len, p.slot_off))
                .collect()
        })
        .collect();
    // Item 1 split at 3 x 64 KiB (what fits after item 0, rounded down to
    // 64 KiB); its tail starts the next job, items 2 and 3 after it, each
    // at the next multiple of 256.
    assert_eq!(
        pieces,
        [
            vec![(0, 0, 100, 0), (1, 0, 3 * s, 256)],
            vec![
                (1, 3 * s as u64, s + 5, 0),
                (2, 0, 2 * s, s + 256),
                (3, 0, 7, 3 * s + 256)
            ],
        ]
    );
    assert_eq!(jobs[1].used, 3 * s + 256 + 7);
    for j in &jobs {
        assert!(j.used <= cap);
    }
    // Skipped items are not packed; many small ones close a job at MAX_PIECES.
    assert!(pack(&items, &[], cap).is_empty());
    let small = sized(&vec![1; MAX_PIECES + 3]);
    let all: Vec<usize> = (0..small.len()).collect();
    let jobs = pack(&small, &all, 1 << 20);
    assert_eq!(
        jobs.iter().map(|j| j.pieces.len()).collect::<Vec<_>>(),
        [MAX_PIECES, 3]
    );
}
