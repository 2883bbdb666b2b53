use burn::nn::Linear;
use burn::prelude::*;

/// `layer` applied to every row of `x` as one `[rows, d_in] x [d_in, d_out]` product.
///
/// `Linear::forward` on a `[batch, len, d_in]` tensor broadcasts the weight over the batch:
/// Burn's CPU backends then run `batch` small products, and the weight's gradient is `batch`
/// partial products summed afterwards (at 224 sequences of 96 rows, 224 `[d_in, d_out]`
/// matrices written and added). Flattening the leading dimensions first gives one product
/// each way, with the same result.
///
/// # Shapes
/// - `x`: `[..., d_in]`; output: `[..., d_out]`
pub fn linear_rows<B: Backend, const D: usize>(layer: &Linear<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    if D <= 2 {
        return layer.forward(x);
    }
    let mut dims = x.dims();
    let d_in = dims[D - 1];
    let rows = dims[..D - 1].iter().product::<usize>();
    let y = layer.forward(x.reshape([rows, d_in]));
    dims[D - 1] = y.dims()[1];
    y.reshape(dims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::{rel_diff, to_f64_vec};
    use crate::test_util::TestAutodiff;
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    /// Equal to `Linear::forward` in its output and in the gradients of the weight, the bias
    /// and the input (f64, to rounding).
    #[test]
    fn equals_the_broadcast_linear_with_its_gradients() {
        let device = Default::default();
        let layer = LinearConfig::new(5, 3).init::<TestAutodiff>(&device);
        let x = Tensor::<TestAutodiff, 3>::random([4, 6, 5], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let w = Tensor::<TestAutodiff, 3>::random([4, 6, 3], Distribution::Normal(0.0, 1.0), &device);
        let run = |rows: bool| {
            let y = if rows { linear_rows(&layer, x.clone()) } else { layer.forward(x.clone()) };
            assert_eq!(y.dims(), [4, 6, 3]);
            let grads = (y.clone() * w.clone()).sum().backward();
            let grad = |t: Option<Vec<f64>>| t.expect("a tracked tensor has a gradient");
            [
                to_f64_vec(y.inner()),
                grad(x.grad(&grads).map(to_f64_vec)),
                grad(layer.weight.grad(&grads).map(to_f64_vec)),
                grad(layer.bias.as_ref().and_then(|b| b.grad(&grads)).map(to_f64_vec)),
            ]
        };
        for (name, (a, b)) in ["output", "input grad", "weight grad", "bias grad"].iter().zip(run(true).into_iter().zip(run(false))) {
            let d = rel_diff(&a, &b);
            assert!(d < 1e-12, "{name}: {d:e}");
        }
    }
}
