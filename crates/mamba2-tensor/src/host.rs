//! Host values into tensors.

use burn::prelude::*;

/// Row-major `f64` host values as a float tensor of `shape` in the backend's float type (f32
/// backends round them once, here). The inverse of [`crate::compare::to_f64_vec`].
///
/// # Panics
/// When `values.len()` is not the product of `shape`: callers build both from the same sizes.
pub fn from_f64_vec<B: Backend, const D: usize>(values: Vec<f64>, shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(values, shape).convert::<B::FloatElem>(), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::to_f64_vec;

    #[test]
    fn values_come_back_in_order_and_shape() {
        let device = Default::default();
        let values = vec![0.5, -1.25, 3.0, 7.5, 1e-3, -2.0];
        let t = from_f64_vec::<burn::backend::NdArray<f64>, 2>(values.clone(), [2, 3], &device);
        assert_eq!(t.dims(), [2, 3]);
        assert_eq!(to_f64_vec(t), values);
        // An f32 backend rounds each value once.
        let t = from_f64_vec::<burn::backend::NdArray<f32>, 1>(vec![0.1], [1], &device);
        assert_eq!(to_f64_vec(t), vec![0.1f32 as f64]);
    }
}
