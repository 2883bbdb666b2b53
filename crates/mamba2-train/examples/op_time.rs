//! Times the pieces of one mixer forward at batch 32, L 96 (profiling aid).
use std::time::Instant;

use burn::backend::Flex;
use burn::prelude::*;
use burn::tensor::Distribution;
use mamba2_ssd::{ssd_chunked, SsdInput};
use mamba2_tensor::{causal_conv1d, rms_norm_gated, segsum, GateOrder};

fn time<T>(name: &str, f: impl Fn() -> T, sync: impl Fn(T)) {
    let t = Instant::now();
    for _ in 0..5 {
        sync(f());
    }
    println!("{name:<28} {:8.2} ms", t.elapsed().as_secs_f64() / 5.0 * 1e3);
}

fn main() {
    type B = Flex;
    let d = Default::default();
    let n = |s: [usize; 3]| Tensor::<B, 3>::random(s, Distribution::Normal(0.0, 1.0), &d);
    let s3 = |t: Tensor<B, 3>| { let _ = t.sum().into_data(); };
    let s4 = |t: Tensor<B, 4>| { let _ = t.sum().into_data(); };
    let (b, l, h, p, g, nn, q) = (32, 96, 8, 16, 1, 16, 32);
    let x = Tensor::<B, 4>::random([b, l, h, p], Distribution::Normal(0.0, 1.0), &d);
    let dt = Tensor::<B, 3>::random([b, l, h], Distribution::Uniform(0.01, 0.1), &d);
    let a = Tensor::<B, 1>::random([h], Distribution::Uniform(-4.0, -1.0), &d);
    let bm = Tensor::<B, 4>::random([b, l, g, nn], Distribution::Normal(0.0, 1.0), &d);
    let input = SsdInput::new(x.clone(), dt.clone(), a, bm.clone(), bm);
    time("ssd_chunked", || ssd_chunked(input.clone(), q).unwrap().y, s4);
    let m = Tensor::<B, 2>::random([b * 3 * h, q], Distribution::Normal(0.0, 1.0), &d);
    time("segsum", || segsum(m.clone()), s3);
    time("segsum.exp", || segsum(m.clone()).exp(), s3);
    let big = n([b * 3 * h, q, q]);
    time("cumsum dim1", || big.clone().cumsum(1), s3);
    time("cumsum dim2", || big.clone().cumsum(2), s3);
    time("exp", || big.clone().exp(), s3);
    let rhs = n([b * 3 * h, q, p]);
    time("bmm [768,32,32]x[768,32,16]", || big.clone().matmul(rhs.clone()), s3);
    time("swap_dims copy", || x.clone().swap_dims(1, 2).reshape([b, h * l, p]).reshape([b, h, l, p]), s4);
    let xbc = n([b, l, 160]);
    let w = Tensor::<B, 2>::random([160, 4], Distribution::Normal(0.0, 1.0), &d);
    time("causal_conv1d", || causal_conv1d(xbc.clone(), w.clone(), None, None).unwrap(), s3);
    let y = n([b, l, 128]);
    let nw = Tensor::<B, 1>::ones([128], &d);
    time("rms_norm_gated", || rms_norm_gated(y.clone(), Some((y.clone(), GateOrder::GateThenNorm)), nw.clone(), 1, 1e-5).unwrap(), s3);
    let lin = Tensor::<B, 2>::random([64, 296], Distribution::Normal(0.0, 1.0), &d);
    let u = n([b, l, 64]);
    time("in_proj matmul", || u.clone().matmul(lin.clone().unsqueeze::<3>()), s3);
    time("tanh", || y.clone().tanh(), s3);
    time("powi_scalar(2)", || y.clone().powi_scalar(2), s3);
    time("x*x", || y.clone() * y.clone(), s3);
    time("mean_dim(2)", || y.clone().mean_dim(2), s3);
    let col = n([b, l, 1]);
    time("broadcast mul [b,l,128]*[b,l,1]", || y.clone() * col.clone(), s3);
    let row = Tensor::<B, 3>::ones([1, 1, 128], &d);
    time("broadcast mul [b,l,128]*[1,1,128]", || y.clone() * row.clone(), s3);
    time("narrow(1)*row", || xbc.clone().narrow(1, 1, 90) * Tensor::<B, 3>::ones([1, 1, 160], &d), s3);
    time("narrow(1) contiguous add", || xbc.clone().narrow(1, 1, 90) + xbc.clone().narrow(1, 2, 90), s3);
    time("sqrt recip", || y.clone().sqrt().recip(), s3);
    time("div_scalar add_scalar", || y.clone().div_scalar(2.0).add_scalar(1.0), s3);
    time("mask_fill expand", || {
        let mask = Tensor::<B, 2, Bool>::tril_mask([q, q], 0, &d).unsqueeze_dim::<3>(0).expand([b * 3 * h, q, q]);
        big.clone().mask_fill(mask, 0.0)
    }, s3);
}
