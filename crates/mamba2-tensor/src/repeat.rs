use burn::prelude::*;

use crate::error::{expect_positive, ShapeError};

/// Repeats each entry of dimension `dim` `repeats` times in place: `[g0, g1] -> [g0, g0, g1, g1]`.
///
/// This maps Mamba-2's `G` groups of B and C to its `H` heads: head `h` reads group
/// `h / (H / G)`. Tiling (`[g0, g1, g0, g1]`) would pair heads with the wrong groups.
///
/// # Shapes
/// - `x`: `[..., G, ...]` with `G` at `dim`
/// - output: `[..., G * repeats, ...]`
pub fn repeat_interleave<B: Backend, const D: usize>(x: Tensor<B, D>, dim: usize, repeats: usize) -> Result<Tensor<B, D>, ShapeError> {
    expect_positive("repeats", repeats)?;
    if dim >= D {
        return Err(ShapeError::BadDim { what: "repeat_interleave", dim, rank: D });
    }
    if repeats == 1 {
        return Ok(x);
    }
    let dims = x.dims();
    let pre: usize = dims[..dim].iter().product();
    let post: usize = dims[dim + 1..].iter().product();
    let g = dims[dim];
    let mut out_dims = dims;
    out_dims[dim] = g * repeats;
    Ok(x.reshape([pre, g, 1, post]).expand([pre, g, repeats, post]).reshape(out_dims))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{to_vec, TestBackend};

    #[test]
    fn repeats_in_place_not_tiled() {
        let device = Default::default();
        let x = Tensor::<TestBackend, 2>::from_data([[1.0, 2.0], [3.0, 4.0]], &device);
        let out = repeat_interleave(x.clone(), 1, 3).unwrap();
        assert_eq!(out.dims(), [2, 6]);
        assert_eq!(to_vec(out), [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 4.0, 4.0, 4.0]);
        let rows = repeat_interleave(x, 0, 2).unwrap();
        assert_eq!(to_vec(rows), [1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]);
    }
}
