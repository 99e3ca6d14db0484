//! The chain over device memory, on the host backend.
use super::*;
use crate::conv3d_chain::TierKind;
use crate::device::Device;

#[test]
fn device_run_matches_host_run_on_the_host_backend() -> Result<()> {
    let dev = Device::host();
    let s = dev.stream()?;
    let x: Vec<f32> = (0..2 * 4 * 5 * 6 * 7)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let w: Vec<f32> = (0..8 * 4 * 3 * 3 * 3)
        .map(|i| ((i * 13 % 29) as f32 - 14.0) / 30.0)
        .collect();
    let b: Vec<f32> = (0..8).map(|k| k as f32 / 4.0).collect();
    let params = Conv3dParams::default()
        .with_padding([1, 0, 1])
        .with_stride([1, 2, 1]);
    let (xs, ws) = ([2usize, 4, 5, 6, 7], [8usize, 4, 3, 3, 3]);
    let p = Conv3dProblem::new(
        params,
        Conv3dData::F32(&x),
        &xs,
        Conv3dData::F32(&w),
        &ws,
        Some(Conv3dData::F32(&b)),
    )?;
    let chain = Conv3dChain::for_device(&dev);
    let (expected, _) = chain.run(&p)?;
    let (xd, wd, bd) = (s.clone_htod(&x)?, s.clone_htod(&w)?, s.clone_htod(&b)?);
    let mut out = s.alloc_zeros::<f32>(expected.len())?;
    let report = chain.run_device(
        &s,
        params,
        DeviceConv3dData::F32(xd.view()),
        &xs,
        DeviceConv3dData::F32(wd.view()),
        &ws,
        Some(DeviceConv3dData::F32(bd.view())),
        &mut out.view_mut(),
    )?;
    assert_eq!(report.served_by(), Some(TierKind::Tiled));
    let got = out.to_vec()?;
    for (g, e) in got.iter().zip(&expected) {
        assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
    }
    // A wrong output length is refused before any tier runs.
    let mut short = s.alloc_zeros::<f32>(3)?;
    assert!(matches!(
        chain.run_device(
            &s,
            params,
            DeviceConv3dData::F32(xd.view()),
            &xs,
            DeviceConv3dData::F32(wd.view()),
            &ws,
            None,
            &mut short.view_mut(),
        ),
        Err(Error::LengthMismatch {
            op: "conv3d device output",
            ..
        })
    ));
    Ok(())
}
