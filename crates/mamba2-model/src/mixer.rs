use burn::module::Param;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::Distribution;
use mamba2_ssd::{ssd_chunked, ssd_step, Skip, SsdInput, StepInput};
use mamba2_tensor::{causal_conv1d, expect_shape, inverse_softplus, silu, softplus, GateOrder};

use crate::bridge;
use crate::norm::RmsNorm;
use crate::{Mamba2Config, MixerState, ModelError};

/// The depthwise convolution's parameters, with the checkpoints' names and shapes.
#[derive(Module, Debug)]
pub struct DepthwiseConv<B: Backend> {
    /// `[conv_dim, 1, d_conv]`.
    pub weight: Param<Tensor<B, 3>>,
    /// `[conv_dim]`, when `conv_bias`.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

/// The Mamba-2 mixer: `in_proj`, causal depthwise conv on `xBC`, the selective scan, the gated
/// group-wise RMS norm and `out_proj`, exactly as in `docs/mamba2-recipe.md`.
///
/// Field names follow the checkpoints (`A_log` is `a_log`, `D` is `d`).
#[derive(Module, Debug)]
pub struct Mamba2Mixer<B: Backend> {
    /// `[d_model] -> [z | xBC | dt]`.
    pub in_proj: Linear<B>,
    /// The causal depthwise convolution over `xBC`.
    pub conv1d: DepthwiseConv<B>,
    /// Added to `dt` before the softplus, `[nheads]`.
    pub dt_bias: Param<Tensor<B, 1>>,
    /// `A = -exp(A_log)`, `[nheads]`.
    pub a_log: Param<Tensor<B, 1>>,
    /// The skip connection, `[nheads]` (or `[d_inner]` with `d_has_hdim`).
    pub d: Param<Tensor<B, 1>>,
    /// The gated norm, `[d_inner]`.
    pub norm: RmsNorm<B>,
    /// `[d_inner] -> [d_model]`.
    pub out_proj: Linear<B>,
    #[module(skip)]
    config: Mamba2Config,
}

/// The longest sequence one mixer call processes at once; longer ones run in pieces.
pub const MAX_PIECE: usize = 512;

/// `x` cut along the sequence into pieces of at most [`MAX_PIECE`] rows; `x` itself, as the one
/// piece, when it is no longer (an empty sequence included).
pub(crate) fn pieces<B: Backend>(x: Tensor<B, 3>) -> Vec<Tensor<B, 3>> {
    let len = x.dims()[1];
    if len <= MAX_PIECE {
        return vec![x];
    }
    (0..len).step_by(MAX_PIECE).map(|start| x.clone().narrow(1, start, MAX_PIECE.min(len - start))).collect()
}

/// The pieces' outputs joined back along the sequence.
pub(crate) fn join_pieces<B: Backend>(mut outs: Vec<Tensor<B, 3>>) -> Tensor<B, 3> {
    if outs.len() == 1 {
        return outs.pop().expect("one piece");
    }
    Tensor::cat(outs, 1)
}

/// A Linear layer with weight `U(-bound, bound)` (`[d_in, d_out]`, Burn's layout) and zero bias.
pub(crate) fn uniform_linear<B: Backend>(d_in: usize, d_out: usize, bound: f64, bias: bool, device: &B::Device) -> Linear<B> {
    Linear {
        weight: Param::from_tensor(Tensor::random([d_in, d_out], Distribution::Uniform(-bound, bound), device)),
        bias: bias.then(|| Param::from_tensor(Tensor::zeros([d_out], device))),
    }
}

/// `U(lo, hi)`, or `lo` everywhere when the range is empty in `f32` (`dt_min = dt_max` and
/// `A_init_range = (a, a)` are valid configs, and Burn's sampler refuses an empty range).
fn uniform_or_constant<B: Backend>(shape: [usize; 1], lo: f64, hi: f64, device: &B::Device) -> Tensor<B, 1> {
    if (lo as f32) < (hi as f32) && (hi as f32).is_finite() && (lo as f32).is_finite() {
        Tensor::random(shape, Distribution::Uniform(lo, hi), device)
    } else {
        Tensor::full(shape, lo, device)
    }
}

impl<B: Backend> Mamba2Mixer<B> {
    /// A mixer with mamba_ssm's initialisation (see the recipe's table).
    pub fn init(config: &Mamba2Config, device: &B::Device) -> Result<Self, ModelError> {
        config.validate()?;
        let (d, di, h, k, cd) = (config.d_model, config.d_inner(), config.nheads(), config.d_conv, config.conv_dim());
        let conv_bound = 1.0 / (k as f64).sqrt();
        let out_bound = 1.0 / (di as f64).sqrt() / if config.rescale_prenorm_residual { (config.n_layer as f64).sqrt() } else { 1.0 };
        let (lo, hi) = (config.dt_min.ln(), config.dt_max.ln());
        let dt0 = uniform_or_constant([h], lo, hi, device).exp().clamp_min(config.dt_init_floor);
        let (a0, a1) = config.a_init_range;
        let d_len = if config.d_has_hdim { di } else { h };
        Ok(Self {
            in_proj: uniform_linear(d, config.d_in_proj(), 1.0 / (d as f64).sqrt(), config.bias, device),
            conv1d: DepthwiseConv {
                weight: Param::from_tensor(Tensor::random([cd, 1, k], Distribution::Uniform(-conv_bound, conv_bound), device)),
                bias: config
                    .conv_bias
                    .then(|| Param::from_tensor(Tensor::random([cd], Distribution::Uniform(-conv_bound, conv_bound), device))),
            },
            dt_bias: Param::from_tensor(inverse_softplus(dt0)),
            a_log: Param::from_tensor(uniform_or_constant([h], a0, a1, device).log()),
            d: Param::from_tensor(Tensor::ones([d_len], device)),
            norm: RmsNorm::new(di, device),
            out_proj: uniform_linear(di, d, out_bound, config.bias, device),
            config: config.clone(),
        })
    }

    /// Assembles a mixer from given parameters (a loaded checkpoint); shapes are checked by the
    /// caller.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        config: &Mamba2Config,
        in_proj: Linear<B>,
        conv1d: DepthwiseConv<B>,
        dt_bias: Tensor<B, 1>,
        a_log: Tensor<B, 1>,
        d: Tensor<B, 1>,
        norm: RmsNorm<B>,
        out_proj: Linear<B>,
    ) -> Self {
        Self {
            in_proj,
            conv1d,
            dt_bias: Param::from_tensor(dt_bias),
            a_log: Param::from_tensor(a_log),
            d: Param::from_tensor(d),
            norm,
            out_proj,
            config: config.clone(),
        }
    }

    /// The config this mixer was built with.
    pub fn config(&self) -> &Mamba2Config {
        &self.config
    }

    fn skip(&self) -> Skip<B> {
        let c = &self.config;
        if c.d_has_hdim {
            Skip::PerChannel(self.d.val().reshape([c.nheads(), c.headdim]))
        } else {
            Skip::PerHead(self.d.val())
        }
    }

    /// `dt = clamp(softplus(dt_raw + dt_bias), dt_limit)`, the same in forward and step.
    fn step_size<const D: usize>(&self, dt_raw: Tensor<B, D>) -> Tensor<B, D> {
        let mut shape = [1; D];
        shape[D - 1] = self.config.nheads();
        let dt = softplus(dt_raw + self.dt_bias.val().reshape(shape));
        let (lo, hi) = self.config.dt_limit();
        let dt = if lo > 0.0 { dt.clamp_min(lo) } else { dt };
        if hi.is_finite() {
            dt.clamp_max(hi)
        } else {
            dt
        }
    }

    fn gate_order(&self) -> GateOrder {
        if self.config.norm_before_gate {
            GateOrder::NormThenGate
        } else {
            GateOrder::GateThenNorm
        }
    }

    pub(crate) fn check_state(&self, state: &MixerState<B>, batch: usize) -> Result<(), ModelError> {
        let c = &self.config;
        expect_shape("conv state", &state.conv.dims(), &[batch, c.d_conv - 1, c.conv_dim()])?;
        expect_shape("ssm state", &state.ssm.dims(), &[batch, c.nheads(), c.headdim, c.d_state])?;
        Ok(())
    }

    /// The mixer over a whole sequence, continuing from `state` (zeros when `None`).
    ///
    /// A forward over `u1` then one over `u2` from the returned state equals one forward over
    /// `u1 ++ u2`, the convolution's tail included. Gradients flow through the input state into
    /// whatever produced it.
    ///
    /// Sequences longer than [`MAX_PIECE`] rows run as consecutive pieces, each continuing from
    /// the last one's state: the same function (by the property above), with per-call buffers
    /// that stay in the allocator's reusable range and in cache, so that the time per token does
    /// not grow with `L`.
    ///
    /// # Shapes
    /// - `u`: `[batch, L, d_model]`
    /// - output: `[batch, L, d_model]` and the state after the last step
    pub fn forward(&self, u: Tensor<B, 3>, state: Option<MixerState<B>>) -> Result<(Tensor<B, 3>, MixerState<B>), ModelError> {
        let mut state = state;
        let mut outs = Vec::new();
        for piece in pieces(u) {
            if let Some(s) = &state {
                self.check_state(s, piece.dims()[0])?;
            }
            let (y, next) = if bridge::runs_on_host::<B>() {
                bridge::mixer(self, piece, state)
            } else {
                let (tail, h0) = state.map(|s| (s.conv, s.ssm)).unzip();
                self.forward_generic(piece, tail, h0)?
            };
            outs.push(y);
            state = Some(next);
        }
        Ok((join_pieces(outs), state.expect("at least one piece")))
    }

    /// The whole mixer from tensor operations: the reference for the CPU kernel and the path of
    /// every other backend.
    fn forward_generic(
        &self,
        u: Tensor<B, 3>,
        conv_tail: Option<Tensor<B, 3>>,
        ssm_state: Option<Tensor<B, 4>>,
    ) -> Result<(Tensor<B, 3>, MixerState<B>), ModelError> {
        let c = &self.config;
        let [batch, len, _] = u.dims();
        let (di, cd, k) = (c.d_inner(), c.conv_dim(), c.d_conv);
        let zxbcdt = self.in_proj.forward(u);
        // The next call's left context: the last k - 1 pre-convolution rows, reaching back into
        // the old tail when this call was shorter than that.
        let xbc = zxbcdt.clone().narrow(2, di, cd);
        let tail = conv_tail.unwrap_or_else(|| Tensor::zeros([batch, k - 1, cd], &xbc.device()));
        let new_tail =
            if len >= k - 1 { xbc.narrow(1, len - (k - 1), k - 1) } else { Tensor::cat(vec![tail.clone(), xbc], 1).narrow(1, len, k - 1) };
        let (y, final_state) = self.core_generic(zxbcdt, tail, ssm_state)?;
        Ok((self.out_proj.forward(y), MixerState { conv: new_tail, ssm: final_state }))
    }

    /// The core (convolution to gated norm) from tensor operations.
    fn core_generic(
        &self,
        zxbcdt: Tensor<B, 3>,
        conv_tail: Tensor<B, 3>,
        ssm_state: Option<Tensor<B, 4>>,
    ) -> Result<(Tensor<B, 3>, Tensor<B, 4>), ModelError> {
        let c = &self.config;
        let [batch, len, _] = zxbcdt.dims();
        let (h, p, g, n, di, cd, k) = (c.nheads(), c.headdim, c.ngroups, c.d_state, c.d_inner(), c.conv_dim(), c.d_conv);
        let z = zxbcdt.clone().narrow(2, 0, di);
        let xbc = zxbcdt.clone().narrow(2, di, cd);
        let dt_raw = zxbcdt.narrow(2, di + cd, h);
        let xbc_conv = silu(causal_conv1d(
            xbc,
            self.conv1d.weight.val().reshape([cd, k]),
            self.conv1d.bias.as_ref().map(Param::val),
            Some(conv_tail),
        )?);
        let x = xbc_conv.clone().narrow(2, 0, di).reshape([batch, len, h, p]);
        let b = xbc_conv.clone().narrow(2, di, g * n).reshape([batch, len, g, n]);
        let cm = xbc_conv.narrow(2, di + g * n, g * n).reshape([batch, len, g, n]);
        let dt = self.step_size(dt_raw);
        let a = self.a_log.val().exp().neg();
        let mut input = SsdInput::new(x, dt, a, b, cm).with_d(self.skip());
        if let Some(s) = ssm_state {
            input = input.with_initial_state(s);
        }
        let out = ssd_chunked(input, c.chunk_size)?;
        let y = out.y.reshape([batch, len, di]);
        let y = self.norm.forward_gated(y, z, self.gate_order(), g, c.norm_eps);
        Ok((y, out.final_state))
    }

    /// One step of the recurrence: the output for one new input row and the state after it.
    ///
    /// # Shapes
    /// - `u`: `[batch, d_model]`; output: `[batch, d_model]`
    pub fn step(&self, u: Tensor<B, 2>, state: MixerState<B>) -> Result<(Tensor<B, 2>, MixerState<B>), ModelError> {
        let c = &self.config;
        let [batch, _] = u.dims();
        let (h, p, g, n, di, cd, k) = (c.nheads(), c.headdim, c.ngroups, c.d_state, c.d_inner(), c.conv_dim(), c.d_conv);
        self.check_state(&state, batch)?;
        let zxbcdt = self.in_proj.forward(u);
        let z = zxbcdt.clone().narrow(1, 0, di);
        let xbc = zxbcdt.clone().narrow(1, di, cd);
        let dt_raw = zxbcdt.narrow(1, di + cd, h);

        // The window is the old tail plus this row; the last tap multiplies this row.
        let window = Tensor::cat(vec![state.conv, xbc.unsqueeze_dim::<3>(1)], 1);
        let weight = self.conv1d.weight.val().reshape([cd, k]).transpose().unsqueeze_dim::<3>(0);
        let mut xbc_conv = (window.clone() * weight).sum_dim(1).reshape([batch, cd]);
        if let Some(bias) = &self.conv1d.bias {
            xbc_conv = xbc_conv + bias.val().unsqueeze_dim::<2>(0);
        }
        let xbc_conv = silu(xbc_conv);
        let new_tail = window.narrow(1, 1, k - 1);

        let step = StepInput {
            x: xbc_conv.clone().narrow(1, 0, di).reshape([batch, h, p]),
            dt: self.step_size(dt_raw),
            a: self.a_log.val().exp().neg(),
            b: xbc_conv.clone().narrow(1, di, g * n).reshape([batch, g, n]),
            c: xbc_conv.narrow(1, di + g * n, g * n).reshape([batch, g, n]),
            d: Some(self.skip()),
            state: state.ssm,
        };
        let out = ssd_step(step)?;
        let y = self.norm.forward_gated(out.y.reshape([batch, di]), z, self.gate_order(), g, c.norm_eps);
        Ok((self.out_proj.forward(y), MixerState { conv: new_tail, ssm: out.state }))
    }
}
