//! Shapes that do not fit give a typed error naming the tensor, never a panic.

use crate::common::*;
use burn::prelude::*;
use mamba2_ssd::{ssd_chunked, ssd_sequential, ssd_step, Skip, SsdError, SsdInput};
use mamba2_tensor::ShapeError;

fn valid(device: &burn::backend::ndarray::NdArrayDevice) -> SsdInput<NdF64> {
    Raw::random(Case { batch: 2, len: 5, h: 4, p: 3, g: 2, n: 3, d: DKind::None, init: false }, 1).input(device)
}

#[test]
fn mismatched_shapes_name_the_tensor() {
    let device = Default::default();
    let mut input = valid(&device);
    input.dt = Tensor::zeros([2, 6, 4], &device);
    assert_eq!(
        ssd_chunked(input, 4).unwrap_err(),
        SsdError::Shape(ShapeError::Mismatch { what: "dt", expected: vec![2, 5, 4], got: vec![2, 6, 4] })
    );

    let mut input = valid(&device);
    input.c = Tensor::zeros([2, 5, 2, 4], &device);
    assert!(matches!(ssd_sequential(input), Err(SsdError::Shape(ShapeError::Mismatch { what: "c", .. }))));

    let input = valid(&device).with_d(Skip::PerChannel(Tensor::zeros([4, 2], &device)));
    assert!(matches!(ssd_chunked(input, 4), Err(SsdError::Shape(ShapeError::Mismatch { what: "d", .. }))));

    let input = valid(&device).with_initial_state(Tensor::zeros([2, 4, 3, 4], &device));
    assert!(matches!(ssd_chunked(input, 4), Err(SsdError::Shape(ShapeError::Mismatch { what: "initial_state", .. }))));
}

#[test]
fn groups_must_divide_heads_and_sizes_must_be_positive() {
    let device = Default::default();
    let raw = Raw::random(Case { batch: 1, len: 3, h: 3, p: 2, g: 2, n: 2, d: DKind::None, init: false }, 2);
    assert_eq!(
        ssd_chunked(raw.input::<NdF64>(&device), 4).unwrap_err(),
        SsdError::Shape(ShapeError::NotDivisible { what: "ngroups into nheads", divisor: 2, total: 3 })
    );
    assert_eq!(ssd_chunked(valid(&device), 0).unwrap_err(), SsdError::Shape(ShapeError::Zero { what: "chunk_size" }));
    let mut empty = valid(&device);
    empty.x = Tensor::zeros([2, 0, 4, 3], &device);
    assert_eq!(ssd_chunked(empty, 4).unwrap_err(), SsdError::Shape(ShapeError::Zero { what: "sequence length" }));
}

#[test]
fn step_checks_its_state() {
    let device = Default::default();
    let raw = Raw::random(Case { batch: 2, len: 1, h: 4, p: 3, g: 2, n: 3, d: DKind::Head, init: false }, 3);
    let step = raw.step_input::<NdF64>(0, Tensor::zeros([2, 4, 3, 2], &device), &device);
    assert_eq!(
        ssd_step(step).unwrap_err(),
        SsdError::Shape(ShapeError::Mismatch { what: "state", expected: vec![2, 4, 3, 3], got: vec![2, 4, 3, 2] })
    );
    let message = SsdError::Shape(ShapeError::Zero { what: "chunk_size" }).to_string();
    assert_eq!(message, "invalid SSD input: chunk_size must be at least 1, got 0");
}
