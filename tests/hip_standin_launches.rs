//! Every kernel launch of the HIP runtime layer over the stand-in HIP
//! runtime (`tests/hip-standin/standin.c`, built here with the C
//! compiler): the argument bytes against the argument metadata of the code
//! object the crate loaded, for every built arch, and an arch with no code
//! object refused (loading and errors: `tests/hip_runtime_standin.rs`).
//!
//! The crate chooses its HIP runtime once per process, so each scenario
//! runs in a child process (`common::hip_standin::scenario`: the test
//! binary itself, asked for exactly that test). Needs only a C compiler
//! (`cc`, or `$CC`); where build.rs found none, every test here is ignored
//! with that reason.
#![cfg(feature = "hip")]

mod common;

use common::hip_scenarios::{
    built, err, hsa_override, loaded_standin, open_device, R, RUNTIME_VAR,
};
use common::hip_standin::{scenario, Launch, PointerArg, Standin};
use half::{bf16, f16};
use rocm_safe::conv3d::{
    Conv3dBackwardProblem, Conv3dData, Conv3dGeometry, Conv3dParams, Conv3dProblem,
};
use rocm_safe::conv3d_chain::{Conv3dChain, Conv3dGuard, DeviceConv3dData, Guarded, GuardedOutput};
use rocm_safe::device::{raw::tiled_wgrad_split, Conv3dKernel};
use rocm_safe::diagnostics::{read_code_object, CodeObjectInfo, KernelResources};
use rocm_safe::Error;

// ----- kernel launches against the code objects' argument metadata ----------

/// One expected argument of a launch.
#[derive(Debug)]
enum Want {
    /// A device address the test knows (0: null).
    Ptr(u64),
    /// A device address the crate made (a scratch buffer).
    AnyPtr,
    /// An 8-byte value.
    U64(u64),
    /// A 4-byte value.
    U32(u32),
    /// A by-value struct, byte for byte.
    Bytes(Vec<u8>),
}

/// Checks one recorded launch against the kernel's metadata and what the
/// crate meant to pass.
fn check_launch(l: &Launch, k: &KernelResources, want: &[Want]) -> R {
    let name = &k.name;
    ensure!(
        l.name == *name,
        "launched {} where {name} was expected",
        l.name
    );
    ensure!(
        l.packed == 1,
        "{name}: arguments not packed by the registered layout"
    );
    let args: Vec<_> = k.explicit_args().collect();
    ensure!(
        args.len() == want.len(),
        "{name}: the code object has {} explicit arguments, the crate's call {}",
        args.len(),
        want.len()
    );
    for (i, (a, w)) in args.iter().zip(want).enumerate() {
        let (off, size) = (a.offset as usize, a.size as usize);
        let at = |len: usize| {
            l.arg_u64(off, len)
                .ok_or(format!("{name} arg {i}: outside the record"))
        };
        match w {
            Want::Ptr(_) | Want::AnyPtr => {
                ensure!(
                    a.value_kind == "global_buffer" && size == 8,
                    "{name} arg {i}: the kernel takes {} of {size} bytes, the crate an address",
                    a.value_kind
                );
                let status = l.pointers.get(i).copied().flatten();
                match w {
                    Want::Ptr(0) => {
                        ensure!(
                            at(8)? == 0 && status == Some(PointerArg::Null),
                            "{name} arg {i}: not null"
                        )
                    }
                    Want::Ptr(p) => {
                        let got = at(8)?;
                        ensure!(
                            got == *p,
                            "{name} arg {i}: address {got:#x}, expected {p:#x}"
                        );
                        ensure!(
                            status == Some(PointerArg::Device),
                            "{name} arg {i}: {status:?}"
                        );
                    }
                    _ => ensure!(
                        status == Some(PointerArg::Device),
                        "{name} arg {i}: scratch address {:#x} is {status:?}",
                        at(8)?
                    ),
                }
            }
            Want::U64(v) => {
                ensure!(
                    a.value_kind == "by_value" && size == 8,
                    "{name} arg {i}: {a:?} for a u64"
                );
                ensure!(at(8)? == *v, "{name} arg {i}: {} expected {v}", at(8)?);
            }
            Want::U32(v) => {
                ensure!(
                    a.value_kind == "by_value" && size == 4,
                    "{name} arg {i}: {a:?} for a u32"
                );
                ensure!(
                    at(4)? == u64::from(*v),
                    "{name} arg {i}: {} expected {v}",
                    at(4)?
                );
            }
            Want::Bytes(b) => {
                ensure!(
                    a.value_kind == "by_value" && size == b.len(),
                    "{name} arg {i}: {a:?} for a struct of {} bytes",
                    b.len()
                );
                let got = l
                    .args
                    .get(off..off + size)
                    .ok_or("struct outside the record")?;
                ensure!(got == &b[..], "{name} arg {i}: struct bytes differ");
            }
        }
    }
    ensure!(l.block == [256, 1, 1], "{name}: block {:?}", l.block);
    ensure!(
        u64::from(l.block[0]) <= k.max_flat_workgroup_size,
        "{name}: {} threads per block, the kernel was built for at most {}",
        l.block[0],
        k.max_flat_workgroup_size
    );
    ensure!(
        u64::from(l.shared) + k.group_segment_fixed_size <= 64 * 1024,
        "{name}: {} + {} bytes of LDS",
        l.shared,
        k.group_segment_fixed_size
    );
    ensure!(l.grid.iter().all(|&g| g >= 1), "{name}: grid {:?}", l.grid);
    Ok(())
}

/// The launches made by `f`, which must be exactly the kernels `names`.
fn launches_of(st: &Standin, names: &[&str], f: impl FnOnce() -> R) -> Result<Vec<Launch>, String> {
    let before = st.launches().len();
    f()?;
    let new: Vec<Launch> = st.launches().split_off(before);
    let got: Vec<&str> = new.iter().map(|l| l.name.as_str()).collect();
    ensure!(got == names, "launched {got:?}, expected {names:?}");
    Ok(new)
}

fn conv3d_struct(g: &Conv3dGeometry, bias: bool) -> Vec<u8> {
    let p = &g.params;
    let fields = [
        g.batch,
        g.in_channels,
        g.input[0],
        g.input[1],
        g.input[2],
        g.out_channels,
        g.kernel[0],
        g.kernel[1],
        g.kernel[2],
        g.output[0],
        g.output[1],
        g.output[2],
        p.stride[0],
        p.stride[1],
        p.stride[2],
        p.padding[0],
        p.padding[1],
        p.padding[2],
        p.dilation[0],
        p.dilation[1],
        p.dilation[2],
        p.groups,
        usize::from(bias),
    ];
    fields
        .iter()
        .flat_map(|&v| (v as u64).to_le_bytes())
        .collect()
}

/// Every kernel the crate launches, for the arch the environment names:
/// the code object the crate loaded is the arch's, and each launch's
/// argument bytes, packed by that code object's metadata, are the values
/// the crate meant.
fn check_every_launch(arch: &str) -> R {
    let dev = open_device()?;
    let st = loaded_standin()?;
    ensure!(
        st.arch() == arch,
        "the stand-in runs {}, expected {arch}",
        st.arch()
    );
    ensure!(
        dev.info().arch == arch,
        "the crate chose {} for {arch}",
        dev.info().arch
    );
    dev.kernel_source().map_err(err("loading the kernels"))?;
    let (image, elf) = st.module_image(0).ok_or("no module loaded")?;
    let info: CodeObjectInfo =
        read_code_object(elf, arch).map_err(err("the loaded code object"))?;
    ensure!(
        info.target.ends_with(arch),
        "loaded the code object of {}",
        info.target
    );
    ensure!(
        read_code_object(image, arch).map_err(err("the loaded bundle"))? == info,
        "the bundle's {arch} entry differs from the code object the stand-in chose"
    );
    for k in &info.kernels {
        let layout: Vec<(u64, u64, bool)> = k
            .explicit_args()
            .map(|a| (a.size, a.offset, a.value_kind == "global_buffer"))
            .collect();
        ensure!(
            !layout.is_empty(),
            "{}: no explicit arguments in the metadata",
            k.name
        );
        st.set_kernel_layout(&k.name, &layout);
    }
    let kernel = |name: &str| {
        info.kernels
            .iter()
            .find(|k| k.name == name)
            .ok_or(format!("{name} missing from the {arch} code object"))
    };
    let s = dev.stream().map_err(err("stream"))?;
    let ptr = |p: rocm_safe::device::raw::DevicePtr| p.0;
    let n = 1000usize;
    let mut launched: Vec<String> = Vec::new();

    // Conversions: (src, dst, n), 8 elements per item.
    let bf = s
        .clone_htod(&vec![bf16::from_f32(1.5); n])
        .map_err(err("upload"))?;
    let hf = s
        .clone_htod(&vec![f16::from_f32(-2.0); n])
        .map_err(err("upload"))?;
    let mut f = s.alloc::<f32>(n).map_err(err("alloc"))?;
    let mut bf_out = s.alloc::<bf16>(n).map_err(err("alloc"))?;
    let mut hf_out = s.alloc::<f16>(n).map_err(err("alloc"))?;
    let one_d = |l: &Launch, items: usize| -> R {
        ensure!(
            l.grid == [items.div_ceil(256) as u32, 1, 1],
            "{}: grid {:?} for {items} items",
            l.name,
            l.grid
        );
        Ok(())
    };
    let convert_items = n.div_ceil(8);
    let l = launches_of(&st, &["convert_bf16_f32"], || {
        s.convert(&bf.view(), &mut f.view_mut())
            .map_err(err("convert"))
    })?;
    check_launch(
        &l[0],
        kernel("convert_bf16_f32")?,
        &[
            Want::Ptr(ptr(bf.device_ptr())),
            Want::Ptr(ptr(f.device_ptr())),
            Want::U64(n as u64),
        ],
    )?;
    one_d(&l[0], convert_items)?;
    ensure!(
        l[0].stream_id == st.stream_id(s.raw().0) && l[0].stream_id != 0,
        "launched on stream {}",
        l[0].stream_id
    );
    let l = launches_of(&st, &["convert_f16_f32"], || {
        s.convert(&hf.view(), &mut f.view_mut())
            .map_err(err("convert"))
    })?;
    check_launch(
        &l[0],
        kernel("convert_f16_f32")?,
        &[
            Want::Ptr(ptr(hf.device_ptr())),
            Want::Ptr(ptr(f.device_ptr())),
            Want::U64(n as u64),
        ],
    )?;
    let l = launches_of(&st, &["convert_f32_bf16"], || {
        s.convert(&f.view(), &mut bf_out.view_mut())
            .map_err(err("convert"))
    })?;
    check_launch(
        &l[0],
        kernel("convert_f32_bf16")?,
        &[
            Want::Ptr(ptr(f.device_ptr())),
            Want::Ptr(ptr(bf_out.device_ptr())),
            Want::U64(n as u64),
        ],
    )?;
    let l = launches_of(&st, &["convert_f32_f16"], || {
        s.convert(&f.view(), &mut hf_out.view_mut())
            .map_err(err("convert"))
    })?;
    check_launch(
        &l[0],
        kernel("convert_f32_f16")?,
        &[
            Want::Ptr(ptr(f.device_ptr())),
            Want::Ptr(ptr(hf_out.device_ptr())),
            Want::U64(n as u64),
        ],
    )?;
    one_d(&l[0], convert_items)?;
    launched.extend(
        [
            "convert_bf16_f32",
            "convert_f16_f32",
            "convert_f32_bf16",
            "convert_f32_f16",
        ]
        .map(String::from),
    );
    // fp8 -> f32 with runtime dtypes: (src, dst, n), 16 elements per item.
    let f8 = s.clone_htod(&vec![0x38u8; n]).map_err(err("upload"))?;
    for (name, dtype) in [
        ("convert_f8_e4m3_f32", rocm_safe::DType::F8_E4M3),
        ("convert_f8_e5m2_f32", rocm_safe::DType::F8_E5M2),
    ] {
        let mut fv = f.view_mut();
        let mut out = fv.cast_mut::<u8>().map_err(err("cast"))?;
        let l = launches_of(&st, &[name], || {
            s.convert_raw(&f8.view(), dtype, &mut out, rocm_safe::DType::F32)
                .map_err(err("convert_raw"))
        })?;
        check_launch(
            &l[0],
            kernel(name)?,
            &[
                Want::Ptr(ptr(f8.device_ptr())),
                Want::Ptr(ptr(f.device_ptr())),
                Want::U64(n as u64),
            ],
        )?;
        one_d(&l[0], n.div_ceil(16))?;
        launched.push(name.into());
    }

    // Exact checks of a widening: (src, dst, n, count), one element per
    // item.
    let mut count = s.alloc_zeros::<u64>(1).map_err(err("alloc count"))?;
    for (name, src, dtype) in [
        (
            "widen_check_bf16_f32",
            bf.view().cast::<u8>(),
            rocm_safe::DType::BF16,
        ),
        (
            "widen_check_f16_f32",
            hf.view().cast::<u8>(),
            rocm_safe::DType::F16,
        ),
        (
            "widen_check_f8_e4m3_f32",
            Ok(f8.view()),
            rocm_safe::DType::F8_E4M3,
        ),
        (
            "widen_check_f8_e5m2_f32",
            Ok(f8.view()),
            rocm_safe::DType::F8_E5M2,
        ),
    ] {
        let src = src.map_err(err("cast"))?;
        let out = f.view();
        let out = out.cast::<u8>().map_err(err("cast"))?;
        let l = launches_of(&st, &[name], || {
            s.widen_check_into(&src, dtype, &out, &mut count.view_mut())
                .map_err(err("widen_check_into"))
        })?;
        check_launch(
            &l[0],
            kernel(name)?,
            &[
                Want::Ptr(ptr(src.device_ptr())),
                Want::Ptr(ptr(f.device_ptr())),
                Want::U64(n as u64),
                Want::Ptr(ptr(count.device_ptr())),
            ],
        )?;
        launched.push(name.into());
    }

    // Fingerprint: (src, nbytes, first_word, acc), 16 bytes per item.
    let mut acc = s.alloc_zeros::<u64>(1).map_err(err("alloc acc"))?;
    let l = launches_of(&st, &["fingerprint_sum_u8"], || {
        s.fingerprint_sum_into(&f.view(), &mut acc.view_mut())
            .map_err(err("fingerprint"))
    })?;
    check_launch(
        &l[0],
        kernel("fingerprint_sum_u8")?,
        &[
            Want::Ptr(ptr(f.device_ptr())),
            Want::U64(4 * n as u64),
            Want::U64(0),
            Want::Ptr(ptr(acc.device_ptr())),
        ],
    )?;
    one_d(&l[0], (4 * n).div_ceil(16))?;
    // Fused: (src, dst, n, acc).
    for (name, src) in [
        ("convert_fingerprint_bf16_f32", ptr(bf.device_ptr())),
        ("convert_fingerprint_f16_f32", ptr(hf.device_ptr())),
    ] {
        let l = launches_of(&st, &[name], || {
            if name.contains("bf16") {
                s.convert_fingerprint_into(&bf.view(), &mut f.view_mut(), &mut acc.view_mut())
            } else {
                s.convert_fingerprint_into(&hf.view(), &mut f.view_mut(), &mut acc.view_mut())
            }
            .map_err(err("convert_fingerprint"))
        })?;
        check_launch(
            &l[0],
            kernel(name)?,
            &[
                Want::Ptr(src),
                Want::Ptr(ptr(f.device_ptr())),
                Want::U64(n as u64),
                Want::Ptr(ptr(acc.device_ptr())),
            ],
        )?;
        launched.push(name.into());
    }
    launched.push("fingerprint_sum_u8".into());

    // Non-finite scans: (ptr, n, clamp, counts, gate).
    for (name, p) in [
        ("nonfinite_f32", ptr(f.device_ptr())),
        ("nonfinite_bf16", ptr(bf_out.device_ptr())),
        ("nonfinite_f16", ptr(hf_out.device_ptr())),
    ] {
        for clamp in [false, true] {
            let l = launches_of(&st, &[name], || {
                let r = match (name, clamp) {
                    ("nonfinite_f32", false) => s.count_nonfinite(&f.view()),
                    ("nonfinite_f32", true) => s.clamp_nonfinite(&mut f.view_mut()),
                    ("nonfinite_bf16", false) => s.count_nonfinite(&bf_out.view()),
                    ("nonfinite_bf16", true) => s.clamp_nonfinite(&mut bf_out.view_mut()),
                    (_, false) => s.count_nonfinite(&hf_out.view()),
                    (_, true) => s.clamp_nonfinite(&mut hf_out.view_mut()),
                };
                r.map(drop).map_err(err("nonfinite"))
            })?;
            check_launch(
                &l[0],
                kernel(name)?,
                &[
                    Want::Ptr(p),
                    Want::U64(n as u64),
                    Want::U32(u32::from(clamp)),
                    Want::AnyPtr,
                    // No gate.
                    Want::Ptr(0),
                ],
            )?;
        }
        launched.push(name.into());
    }

    // conv3d: (x, w, bias, y, rs_conv3d_args by value; the tiled kernels
    // also gate, y_bf16), with and without a bias.
    let g = Conv3dProblem::new(
        Conv3dParams {
            stride: [1, 2, 1],
            padding: [1, 0, 1],
            dilation: [1, 1, 2],
            groups: 2,
        },
        Conv3dData::F32(&[0.0; 2 * 4 * 5 * 6 * 7]),
        &[2usize, 4, 5, 6, 7],
        Conv3dData::F32(&[0.0; 16 * 2 * 3 * 2 * 2]),
        &[16usize, 2, 3, 2, 2],
        None,
    )
    .map_err(err("conv3d problem"))?
    .geometry;
    let input_len: usize = g.input_shape().iter().product();
    let weight_len: usize = g.weight_shape().iter().product();
    let bias = s
        .clone_htod(&vec![0.5f32; g.out_channels])
        .map_err(err("bias"))?;
    let mut y = s.alloc::<f32>(g.output_len()).map_err(err("y"))?;
    for (dtype, kind) in [
        ("f32", Conv3dKernel::Naive),
        ("f32", Conv3dKernel::Tiled),
        ("bf16", Conv3dKernel::Naive),
        ("bf16", Conv3dKernel::Tiled),
    ] {
        let name = format!(
            "conv3d_{}_{dtype}",
            if kind == Conv3dKernel::Naive {
                "naive"
            } else {
                "tiled"
            }
        );
        for with_bias in [false, true] {
            let b = with_bias.then(|| bias.view());
            let (x_ptr, w_ptr);
            let l = if dtype == "f32" {
                let x = s.clone_htod(&vec![1f32; input_len]).map_err(err("x"))?;
                let w = s.alloc_zeros::<f32>(weight_len).map_err(err("w"))?;
                (x_ptr, w_ptr) = (ptr(x.device_ptr()), ptr(w.device_ptr()));
                launches_of(&st, &[&name], || {
                    s.conv3d_ops()
                        .forward(kind, &g, &x.view(), &w.view(), b, &mut y.view_mut())
                        .map_err(err("conv3d"))
                })?
            } else {
                let x = s
                    .clone_htod(&vec![bf16::ONE; input_len])
                    .map_err(err("x"))?;
                let w = s.alloc_zeros::<bf16>(weight_len).map_err(err("w"))?;
                (x_ptr, w_ptr) = (ptr(x.device_ptr()), ptr(w.device_ptr()));
                launches_of(&st, &[&name], || {
                    s.conv3d_ops()
                        .forward(kind, &g, &x.view(), &w.view(), b, &mut y.view_mut())
                        .map_err(err("conv3d"))
                })?
            };
            let bias_ptr = if with_bias { ptr(bias.device_ptr()) } else { 0 };
            let mut want = vec![
                Want::Ptr(x_ptr),
                Want::Ptr(w_ptr),
                Want::Ptr(bias_ptr),
                Want::Ptr(ptr(y.device_ptr())),
                Want::Bytes(conv3d_struct(&g, with_bias)),
            ];
            if kind == Conv3dKernel::Tiled {
                // No gate, an f32 output.
                want.extend([Want::Ptr(0), Want::U64(0)]);
            }
            check_launch(&l[0], kernel(&name)?, &want)?;
        }
        launched.push(name);
    }
    // The tiled weight gradient: (x, dy, dw, rs_conv3d_args without a
    // bias, chunk) on the split-K grid (dw zeroed first by a memset, not a
    // kernel).
    let split = tiled_wgrad_split(&g, dev.info().multiprocessors).map_err(err("wgrad split"))?;
    let mut dw = s.alloc::<f32>(weight_len).map_err(err("dw"))?;
    for dtype in ["f32", "bf16"] {
        let name = format!("conv3d_bwd_weight_tiled_{dtype}");
        let (x_ptr, dy_ptr);
        let l = if dtype == "f32" {
            let x = s.clone_htod(&vec![1f32; input_len]).map_err(err("x"))?;
            let dy = s
                .clone_htod(&vec![0.5f32; g.output_len()])
                .map_err(err("dy"))?;
            (x_ptr, dy_ptr) = (ptr(x.device_ptr()), ptr(dy.device_ptr()));
            launches_of(&st, &[&name], || {
                s.conv3d_ops()
                    .backward_weight_tiled(&g, &x.view(), &dy.view(), &mut dw.view_mut())
                    .map_err(err("conv3d_backward_weight_tiled"))
            })?
        } else {
            let x = s
                .clone_htod(&vec![bf16::ONE; input_len])
                .map_err(err("x"))?;
            let dy = s
                .clone_htod(&vec![bf16::ONE; g.output_len()])
                .map_err(err("dy"))?;
            (x_ptr, dy_ptr) = (ptr(x.device_ptr()), ptr(dy.device_ptr()));
            launches_of(&st, &[&name], || {
                s.conv3d_ops()
                    .backward_weight_tiled(&g, &x.view(), &dy.view(), &mut dw.view_mut())
                    .map_err(err("conv3d_backward_weight_tiled"))
            })?
        };
        check_launch(
            &l[0],
            kernel(&name)?,
            &[
                Want::Ptr(x_ptr),
                Want::Ptr(dy_ptr),
                Want::Ptr(ptr(dw.device_ptr())),
                Want::Bytes(conv3d_struct(&g, false)),
                Want::U64(split.chunk),
            ],
        )?;
        ensure!(
            l[0].grid == split.grid,
            "{name}: grid {:?}, expected {:?}",
            l[0].grid,
            split.grid
        );
        launched.push(name);
    }
    s.synchronize().map_err(err("synchronize"))?;

    // Every recorded launch was packed by its kernel's layout, and the
    // kernels launched are those the test expected.
    for l in st.launches() {
        ensure!(
            l.packed == 1,
            "{}: launched without a layout (an unknown kernel?)",
            l.name
        );
    }
    let names: std::collections::BTreeSet<String> =
        st.launches().into_iter().map(|l| l.name).collect();
    let want: std::collections::BTreeSet<String> = launched.into_iter().collect();
    ensure!(
        names == want,
        "kernels launched {names:?}, checked {want:?}"
    );
    // The conv3d chain's own launches (its tiers and the checks of their
    // output on the device): values the test cannot predict, but each is
    // packed by its kernel's layout, in the block the kernel was built
    // for, with every address inside device memory (or null).
    let before = st.launches().len();
    let x: Vec<f32> = (0..2 * 4 * 5 * 6 * 7)
        .map(|i| (i % 5) as f32 - 2.0)
        .collect();
    let w: Vec<f32> = (0..16 * 2 * 3 * 2 * 2)
        .map(|i| (i % 3) as f32 - 1.0)
        .collect();
    let p = Conv3dProblem::new(
        g.params,
        Conv3dData::F32(&x),
        &[2usize, 4, 5, 6, 7],
        Conv3dData::F32(&w),
        &[16usize, 2, 3, 2, 2],
        None,
    )
    .map_err(err("conv3d problem"))?;
    Conv3dChain::for_device(&dev)
        .run(&p)
        .map_err(err("conv3d chain"))?;
    // A strided input gradient the tiled tier takes: its zero insertion,
    // weight flip, layout and tiled kernel launch (the stand-in runs none,
    // so the checks fail it and the tiers after it serve).
    let (bx, bw) = ([1usize, 16, 5, 6, 7], [8usize, 16, 3, 3, 3]);
    let params = Conv3dParams::default()
        .with_stride([2, 1, 2])
        .with_padding([1; 3]);
    let bg = Conv3dGeometry::new(params, &bx, &bw).map_err(err("backward geometry"))?;
    let dy = vec![0.5f32; bg.output_len()];
    let bwt = vec![0.25f32; bw.iter().product()];
    let bp = Conv3dBackwardProblem::data(
        params,
        &bx,
        &bw,
        Conv3dData::F32(&dy),
        Conv3dData::F32(&bwt),
    )
    .map_err(err("backward problem"))?;
    Conv3dChain::for_device(&dev)
        .run_backward(&bp)
        .map_err(err("conv3d backward chain"))?;
    // The guarded fallback: its fused checks (before and behind the gate)
    // and its gated repair, checked as the chain's launches are.
    let (gx, gw) = (
        s.clone_htod(&x).map_err(err("upload"))?,
        s.clone_htod(&w).map_err(err("upload"))?,
    );
    let mut gy = s
        .alloc::<f32>(p.geometry.output_len())
        .map_err(err("alloc"))?;
    let queued = Conv3dGuard::new(&dev)
        .guard(
            &Conv3dChain::for_device(&dev),
            &s,
            g.params,
            (DeviceConv3dData::F32(gx.view()), &[2usize, 4, 5, 6, 7][..]),
            (DeviceConv3dData::F32(gw.view()), &[16usize, 2, 3, 2, 2][..]),
            Some(DeviceConv3dData::F32(bias.view())),
            GuardedOutput::F32(gy.view_mut()),
            (8, 1e-4),
        )
        .map_err(err("conv3d guard"))?;
    ensure!(
        matches!(queued, Guarded::Queued { .. }),
        "the guard queued nothing: {queued:?}"
    );
    let chain = st.launches().split_off(before);
    ensure!(
        chain
            .iter()
            .filter(|l| l.name == "conv3d_guard_check_f32")
            .count()
            == 2,
        "the guard did not launch its two fused checks"
    );
    for name in ["conv3d_zero_insert_u32", "conv3d_flip_weight_u32"] {
        ensure!(
            chain.iter().any(|l| l.name == name),
            "the backward chain did not launch {name}"
        );
    }
    ensure!(!chain.is_empty(), "the chain launched nothing");
    for l in &chain {
        let k = kernel(&l.name)?;
        ensure!(l.packed == 1, "{}: not packed by its layout", l.name);
        ensure!(
            l.block.iter().product::<u32>() as u64 <= k.max_flat_workgroup_size,
            "{}: block {:?} over the kernel's {}",
            l.name,
            l.block,
            k.max_flat_workgroup_size
        );
        for (i, ptr) in l.pointers.iter().enumerate() {
            ensure!(
                !matches!(ptr, Some(PointerArg::Elsewhere)),
                "{} arg {i}: an address outside device memory",
                l.name
            );
        }
    }
    println!(
        "{arch}: checked {} kernels by value, {} chain launches of {:?}",
        want.len(),
        chain.len(),
        chain
            .iter()
            .map(|l| l.name.as_str())
            .collect::<std::collections::BTreeSet<_>>()
    );
    ensure!(
        st.pending_errors() == (0, 0),
        "pending: {:?}",
        st.pending_errors()
    );
    Ok(())
}

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn every_launch_matches_the_argument_metadata_of_every_built_arch() {
    let archs = rocm_safe::device::hip::built_archs();
    assert!(!archs.is_empty(), "a hip build embeds code objects");
    for arch in archs {
        scenario(
            "every_launch_matches_the_argument_metadata_of_every_built_arch",
            arch,
            |c| {
                c.env(RUNTIME_VAR, built().file(7))
                    .env("HSA_OVERRIDE_GFX_VERSION", hsa_override(arch));
            },
            || check_every_launch(arch),
        );
    }
}

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn an_arch_with_no_code_object_is_refused_with_the_reason() {
    scenario(
        "an_arch_with_no_code_object_is_refused_with_the_reason",
        "HIP 7",
        |c| {
            c.env(RUNTIME_VAR, built().file(7))
                .env("HSA_OVERRIDE_GFX_VERSION", "10.1.0");
        },
        || {
            let dev = open_device()?;
            ensure!(dev.info().arch == "gfx1010", "arch {}", dev.info().arch);
            let st = loaded_standin()?;
            let e = match dev.kernel_source() {
                Ok(k) => return Err(format!("kernels for gfx1010 from {k:?}")),
                Err(e) => e,
            };
            ensure!(
                matches!(e, Error::KernelUnavailable { .. }) && e.to_string().contains("gfx1010"),
                "{e}"
            );
            ensure!(
                st.calls("hipModuleLoadData") == 0,
                "a code object of another arch was loaded"
            );
            Ok(())
        },
    );
}
#[test]
fn hsa_override_strings() {
    assert_eq!(hsa_override("gfx1151"), "11.5.1");
    assert_eq!(hsa_override("gfx1100"), "11.0.0");
    assert_eq!(hsa_override("gfx1201"), "12.0.1");
    assert_eq!(hsa_override("gfx942"), "9.4.2");
    assert_eq!(hsa_override("gfx90a"), "9.0.10");
}
