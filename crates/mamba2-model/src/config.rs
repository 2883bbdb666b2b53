use burn::prelude::*;

use crate::ModelError;

/// The hyper-parameters of a Mamba-2 stack, with mamba_ssm's defaults.
///
/// Derived sizes are methods: [`d_inner`](Self::d_inner), [`nheads`](Self::nheads),
/// [`conv_dim`](Self::conv_dim), [`d_in_proj`](Self::d_in_proj). Call
/// [`validate`](Self::validate) before building a model from a config that came from a user.
#[derive(Config, Debug, PartialEq)]
pub struct Mamba2Config {
    /// Width of the residual stream, `D`.
    pub d_model: usize,
    /// Number of blocks.
    pub n_layer: usize,
    /// State size per channel, `N`.
    #[config(default = 128)]
    pub d_state: usize,
    /// Width of the causal depthwise convolution, `K`.
    #[config(default = 4)]
    pub d_conv: usize,
    /// `d_inner = expand * d_model`.
    #[config(default = 2)]
    pub expand: usize,
    /// Channels per head, `P`.
    #[config(default = 64)]
    pub headdim: usize,
    /// Groups of B and C, `G`; must divide the number of heads.
    #[config(default = 1)]
    pub ngroups: usize,
    /// Chunk length `Q` of the chunked scan.
    #[config(default = 256)]
    pub chunk_size: usize,
    /// Smallest initial step size.
    #[config(default = 1e-3)]
    pub dt_min: f64,
    /// Largest initial step size.
    #[config(default = 0.1)]
    pub dt_max: f64,
    /// Floor of the initial step sizes.
    #[config(default = 1e-4)]
    pub dt_init_floor: f64,
    /// Lower clamp of `dt` after softplus, in forward and step.
    #[config(default = 0.0)]
    pub dt_limit_lo: f64,
    /// Upper clamp of `dt` after softplus; `None` is no clamp (`inf`).
    pub dt_limit_hi: Option<f64>,
    /// `A = -exp(A_log)` is initialised with `A` uniform in this range.
    #[config(default = "(1.0, 16.0)")]
    pub a_init_range: (f64, f64),
    /// Biases in `in_proj` and `out_proj`.
    #[config(default = false)]
    pub bias: bool,
    /// Bias in the convolution.
    #[config(default = true)]
    pub conv_bias: bool,
    /// Gate after the norm (`true`) or before it (`false`, every released checkpoint).
    #[config(default = false)]
    pub norm_before_gate: bool,
    /// `D` per channel `[H, P]` instead of per head `[H]`.
    #[config(default = false)]
    pub d_has_hdim: bool,
    /// Epsilon of every RMS norm.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
    /// Keep the residual stream in f32 at least. Every backend here computes in one float type
    /// (f32 or f64), so this only matters for lower-precision backends.
    #[config(default = true)]
    pub residual_in_fp32: bool,
    /// Divide `out_proj` by `sqrt(n_layer)` at initialisation.
    #[config(default = true)]
    pub rescale_prenorm_residual: bool,
}

/// A config whose sizes do not fit together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A size that must be positive is zero.
    #[error("config: {name} must be at least 1, got 0")]
    Zero {
        /// The field.
        name: &'static str,
    },
    /// One size must divide another.
    #[error("config: {what} ({divisor} does not divide {total})")]
    NotDivisible {
        /// What must divide what.
        what: &'static str,
        /// The divisor.
        divisor: usize,
        /// The total.
        total: usize,
    },
    /// A size is beyond any model this code is meant for.
    #[error("config: {name} = {value} is larger than {max}")]
    TooLarge {
        /// The field.
        name: &'static str,
        /// Its value.
        value: usize,
        /// The largest accepted.
        max: usize,
    },
    /// A real-valued field is out of its range.
    #[error("config: {name} = {value} is invalid: {why}")]
    Invalid {
        /// The field.
        name: &'static str,
        /// Its value, as written.
        value: String,
        /// The rule it breaks.
        why: &'static str,
    },
}

impl Mamba2Config {
    /// `expand * d_model`.
    pub fn d_inner(&self) -> usize {
        self.expand * self.d_model
    }

    /// `d_inner / headdim`.
    pub fn nheads(&self) -> usize {
        self.d_inner() / self.headdim
    }

    /// Channels entering the convolution: `d_inner + 2 G N` (x, B and C).
    pub fn conv_dim(&self) -> usize {
        self.d_inner() + 2 * self.ngroups * self.d_state
    }

    /// Output width of `in_proj`: `z | xBC | dt`.
    pub fn d_in_proj(&self) -> usize {
        2 * self.d_inner() + 2 * self.ngroups * self.d_state + self.nheads()
    }

    /// `(lo, hi)` of the `dt` clamp, `hi = inf` when unset.
    pub fn dt_limit(&self) -> (f64, f64) {
        (self.dt_limit_lo, self.dt_limit_hi.unwrap_or(f64::INFINITY))
    }

    /// Checks that every size is positive and that the sizes divide as the model needs.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, v) in [
            ("d_model", self.d_model),
            ("n_layer", self.n_layer),
            ("d_state", self.d_state),
            ("d_conv", self.d_conv),
            ("expand", self.expand),
            ("headdim", self.headdim),
            ("ngroups", self.ngroups),
            ("chunk_size", self.chunk_size),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero { name });
            }
        }
        // Bounds far above any real model, checked before any size is multiplied or memory is
        // reserved: a config read from someone else's file must not overflow or ask for
        // terabytes.
        for (name, v, max) in [
            ("d_model", self.d_model, 1 << 16),
            ("n_layer", self.n_layer, 1 << 10),
            ("d_state", self.d_state, 1 << 12),
            ("d_conv", self.d_conv, 1 << 6),
            ("expand", self.expand, 1 << 6),
            ("headdim", self.headdim, 1 << 12),
            ("ngroups", self.ngroups, 1 << 12),
            ("chunk_size", self.chunk_size, 1 << 16),
        ] {
            if v > max {
                return Err(ConfigError::TooLarge { name, value: v, max });
            }
        }
        let weights = self.n_layer * self.d_model * (self.d_in_proj() + self.d_inner());
        if weights > 1 << 34 {
            return Err(ConfigError::TooLarge {
                name: "parameters (n_layer * d_model * (d_in_proj + d_inner))",
                value: weights,
                max: 1 << 34,
            });
        }
        if self.d_conv < 2 {
            return Err(ConfigError::Invalid { name: "d_conv", value: self.d_conv.to_string(), why: "must be at least 2" });
        }
        if !self.d_inner().is_multiple_of(self.headdim) {
            return Err(ConfigError::NotDivisible {
                what: "headdim must divide d_inner = expand * d_model",
                divisor: self.headdim,
                total: self.d_inner(),
            });
        }
        if !self.nheads().is_multiple_of(self.ngroups) {
            return Err(ConfigError::NotDivisible {
                what: "ngroups must divide nheads = d_inner / headdim",
                divisor: self.ngroups,
                total: self.nheads(),
            });
        }
        let positive = |name: &'static str, v: f64| {
            if v > 0.0 && v.is_finite() {
                Ok(())
            } else {
                Err(ConfigError::Invalid { name, value: v.to_string(), why: "must be positive and finite" })
            }
        };
        positive("dt_min", self.dt_min)?;
        positive("dt_max", self.dt_max)?;
        positive("dt_init_floor", self.dt_init_floor)?;
        positive("norm_eps", self.norm_eps)?;
        if self.dt_min > self.dt_max {
            return Err(ConfigError::Invalid { name: "dt_min", value: self.dt_min.to_string(), why: "must not exceed dt_max" });
        }
        let (lo, hi) = self.dt_limit();
        if !(lo >= 0.0 && lo < hi) {
            return Err(ConfigError::Invalid { name: "dt_limit", value: format!("({lo}, {hi})"), why: "needs 0 <= lo < hi" });
        }
        let (a0, a1) = self.a_init_range;
        if !(a0 > 0.0 && a0 <= a1 && a1.is_finite()) {
            return Err(ConfigError::Invalid { name: "a_init_range", value: format!("({a0}, {a1})"), why: "needs 0 < lo <= hi < inf" });
        }
        Ok(())
    }

    /// Reads an HF transformers `config.json` of a `Mamba2` model.
    ///
    /// Returns the stack's config and the language-model extras (vocabulary size and whether the
    /// head is tied to the embedding).
    pub fn from_hf_json(text: &str) -> Result<(Self, HfExtras), ModelError> {
        let v: serde_json::Value =
            serde_json::from_str(&bare_infinity_to_number(text)).map_err(|e| ModelError::HfConfig { why: format!("not JSON: {e}") })?;
        let usize_field = |name: &str| -> Result<usize, ModelError> {
            v.get(name)
                .and_then(|x| x.as_u64())
                .map(|x| x as usize)
                .ok_or_else(|| ModelError::HfConfig { why: format!("missing or non-integer field `{name}`") })
        };
        let f64_or = |name: &str, default: f64| v.get(name).and_then(|x| x.as_f64()).unwrap_or(default);
        let bool_or = |name: &str, default: bool| v.get(name).and_then(|x| x.as_bool()).unwrap_or(default);
        let d_model = usize_field("hidden_size")?;
        let expand = usize_field("expand")?;
        let headdim = usize_field("head_dim")?;
        let num_heads = usize_field("num_heads")?;
        if num_heads * headdim != expand * d_model {
            return Err(ModelError::HfConfig {
                why: format!("num_heads {num_heads} * head_dim {headdim} != expand {expand} * hidden_size {d_model}"),
            });
        }
        // transformers 5 writes inf as {"__float__": "Infinity"}.
        let loose = |x: &serde_json::Value| -> Option<f64> {
            x.as_f64().or_else(|| match x.get("__float__")?.as_str()? {
                "Infinity" | "1e308" => Some(f64::INFINITY),
                "-Infinity" => Some(f64::NEG_INFINITY),
                _ => None,
            })
        };
        let (lo, hi) = match v.get("time_step_limit").and_then(|x| x.as_array()) {
            Some(pair) if pair.len() == 2 => match (loose(&pair[0]), loose(&pair[1])) {
                (Some(lo), Some(hi)) => (lo, hi),
                _ => return Err(ModelError::HfConfig { why: format!("unreadable time_step_limit {pair:?}") }),
            },
            _ => (0.0, f64::INFINITY),
        };
        let config = Mamba2Config::new(d_model, usize_field("num_hidden_layers")?)
            .with_d_state(usize_field("state_size")?)
            .with_d_conv(usize_field("conv_kernel")?)
            .with_expand(expand)
            .with_headdim(headdim)
            .with_ngroups(usize_field("n_groups")?)
            .with_chunk_size(usize_field("chunk_size")?)
            .with_dt_min(f64_or("time_step_min", 1e-3))
            .with_dt_max(f64_or("time_step_max", 0.1))
            .with_dt_init_floor(f64_or("time_step_floor", 1e-4))
            .with_dt_limit_lo(lo)
            .with_dt_limit_hi(if hi >= 1e308 { None } else { Some(hi) })
            .with_bias(bool_or("use_bias", false))
            .with_conv_bias(bool_or("use_conv_bias", true))
            .with_norm_eps(f64_or("layer_norm_epsilon", 1e-5))
            .with_residual_in_fp32(bool_or("residual_in_fp32", true))
            .with_rescale_prenorm_residual(bool_or("rescale_prenorm_residual", false));
        config.validate()?;
        let extras = HfExtras { vocab_size: usize_field("vocab_size")?, tie_word_embeddings: bool_or("tie_word_embeddings", true) };
        Ok((config, extras))
    }
}

/// What an HF config says beyond the stack itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HfExtras {
    /// Rows of the embedding.
    pub vocab_size: usize,
    /// Whether `lm_head` is the embedding itself.
    pub tie_word_embeddings: bool,
}

/// Python's `json` writes inf as a bare `Infinity`, which is not JSON: outside strings, turn it
/// into `1e308` (read back as inf, as nothing real in a config is that large).
fn bare_infinity_to_number(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(ch) = rest.chars().next() {
        if !in_string && rest.starts_with("Infinity") {
            out.push_str("1e308");
            rest = &rest["Infinity".len()..];
            continue;
        }
        if in_string {
            if escaped {
                escaped = false;
            } else if ch == '\\' {
                escaped = true;
            } else if ch == '"' {
                in_string = false;
            }
        } else if ch == '"' {
            in_string = true;
        }
        out.push(ch);
        rest = &rest[ch.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_infinity_is_read_outside_strings_only() {
        assert_eq!(
            bare_infinity_to_number(r#"{"a": [0.0, Infinity], "b": "Infinity", "c": -Infinity}"#),
            r#"{"a": [0.0, 1e308], "b": "Infinity", "c": -1e308}"#
        );
    }

    #[test]
    fn validation_names_the_bad_sizes() {
        let c = Mamba2Config::new(10, 1).with_headdim(6);
        assert_eq!(
            c.validate().unwrap_err(),
            ConfigError::NotDivisible { what: "headdim must divide d_inner = expand * d_model", divisor: 6, total: 20 }
        );
        let c = Mamba2Config::new(16, 1).with_headdim(8).with_ngroups(3);
        assert_eq!(c.validate().unwrap_err().to_string(), "config: ngroups must divide nheads = d_inner / headdim (3 does not divide 4)");
        assert_eq!(Mamba2Config::new(0, 1).validate().unwrap_err(), ConfigError::Zero { name: "d_model" });
        assert!(matches!(
            Mamba2Config::new(16, 1).with_headdim(8).with_dt_min(0.5).validate(),
            Err(ConfigError::Invalid { name: "dt_min", .. })
        ));
        assert!(Mamba2Config::new(16, 1).with_headdim(8).validate().is_ok());
    }

    #[test]
    fn derived_sizes_follow_the_recipe() {
        // mamba2-130m: D 768, N 128, P 64 -> H 24.
        let c = Mamba2Config::new(768, 24);
        assert_eq!((c.d_inner(), c.nheads(), c.conv_dim(), c.d_in_proj()), (1536, 24, 1536 + 256, 2 * 1536 + 256 + 24));
    }
}
