use burn::nn::Linear;
use burn::prelude::*;
use mamba2_cpu::linear::{self as kernel, LinearDims};

use crate::{host_op, runs_on_host, HostFloat, HostOp};

/// `layer` over every row of `x`, as [`mamba2_tensor::linear_rows`] (its reference, and what
/// every other backend runs); on the CPU backends one autodiff node over host slices, whose
/// weight gradient is summed in shares of the rows on the thread pool (`mamba2_cpu::linear`).
///
/// # Shapes
/// - `x`: `[..., d_in]`; output: `[..., d_out]`
pub fn linear_rows<B: Backend, const D: usize>(layer: &Linear<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    if !runs_on_host::<B>() {
        return mamba2_tensor::linear_rows(layer, x);
    }
    let mut dims = x.dims();
    let [d_in, d_out] = layer.weight.dims();
    let rows = dims[..D - 1].iter().product::<usize>();
    let op = RowsLinear(LinearDims { rows, d_in, d_out });
    let y = host_op(
        op,
        [Some(x.reshape([rows * d_in])), Some(layer.weight.val().reshape([d_in * d_out])), layer.bias.as_ref().map(|b| b.val())],
    );
    dims[D - 1] = d_out;
    y.reshape(dims)
}

/// The node: inputs `x`, `w`, `b` (flat), output `[rows, d_out]`.
#[derive(Debug, Clone, Copy)]
struct RowsLinear(LinearDims);

impl HostOp<3> for RowsLinear {
    type Saved<T: HostFloat> = ();

    fn out_len(&self) -> usize {
        self.0.rows * self.0.d_out
    }

    fn forward<T: HostFloat>(&self, [x, w, b]: [Option<&[T]>; 3], _keep: bool) -> (Vec<T>, Option<()>) {
        let (x, w) = (x.expect("linear_rows gives x"), w.expect("linear_rows gives w"));
        (kernel::forward(self.0, x, w, b), Some(()))
    }

    fn backward<T: HostFloat>(&self, [x, w, _]: [Option<&[T]>; 3], _saved: &(), gout: &[T], wanted: [bool; 3]) -> [Vec<T>; 3] {
        kernel::backward(self.0, x.expect("linear_rows gives x"), w.expect("linear_rows gives w"), gout, wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex, NdArray};
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;
    use mamba2_tensor::compare::{rel_diff, to_f64_vec};

    /// The host node equals the tensor reference in its output and in the gradients of the input,
    /// the weight and the bias, with and without a bias, in f64 (NdArray) and f32 (Flex).
    fn agrees<B: burn::tensor::backend::AutodiffBackend>(tol: f64) {
        let device = Default::default();
        for bias in [true, false] {
            let layer = LinearConfig::new(6, 4).with_bias(bias).init::<B>(&device);
            let x = Tensor::<B, 3>::random([3, 5, 6], Distribution::Normal(0.0, 1.0), &device).require_grad();
            let w = Tensor::<B, 3>::random([3, 5, 4], Distribution::Normal(0.0, 1.0), &device);
            let run = |host: bool| {
                let y = if host { linear_rows(&layer, x.clone()) } else { crate::with_generic_path(|| linear_rows(&layer, x.clone())) };
                let grads = (y.clone() * w.clone()).sum().backward();
                let mut out = vec![to_f64_vec(y.inner()), to_f64_vec(x.grad(&grads).expect("x is tracked"))];
                out.push(to_f64_vec(layer.weight.grad(&grads).expect("the weight is tracked")));
                if let Some(b) = &layer.bias {
                    out.push(to_f64_vec(b.grad(&grads).expect("the bias is tracked")));
                }
                out
            };
            let (host, reference) = (run(true), run(false));
            assert_eq!(host.len(), if bias { 4 } else { 3 });
            for (i, (a, b)) in host.iter().zip(&reference).enumerate() {
                let d = rel_diff(a, b);
                assert!(d <= tol, "bias {bias}, part {i}: {d:e}");
            }
        }
    }

    #[test]
    fn the_host_node_equals_the_tensor_reference() {
        agrees::<Autodiff<NdArray<f64>>>(1e-12);
        agrees::<Autodiff<Flex>>(1e-5);
    }
}
