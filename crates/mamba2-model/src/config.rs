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

    /// Reads a `config.json` of a Mamba-2 language model, in either of the two forms such
    /// checkpoints come with: HF transformers' `Mamba2Config` (`hidden_size`, `num_heads`, ...)
    /// or the original mamba_ssm `MambaConfig` (`d_model`, `n_layer`, `ssm_cfg`, ...).
    ///
    /// A key that is missing takes the default of the library that wrote the form (HF's
    /// `Mamba2Config`, mamba_ssm's `MambaConfig` and `Mamba2` layer), as those libraries would
    /// load the file; a key that is present with a value of the wrong kind is an error naming it.
    /// Returns the stack's config and the language-model extras (vocabulary size and whether the
    /// head is tied to the embedding).
    pub fn from_hf_json(text: &str) -> Result<(Self, HfExtras), ModelError> {
        let v: serde_json::Value =
            serde_json::from_str(&bare_infinity_to_number(text)).map_err(|e| ModelError::HfConfig { why: format!("not JSON: {e}") })?;
        let top = JsonFields::new(&v, "")?;
        if top.has("d_model") || top.has("ssm_cfg") {
            Self::from_mamba_ssm(&top)
        } else {
            Self::from_transformers(&top)
        }
    }

    /// HF transformers' form; the defaults are `Mamba2Config.__init__`'s.
    fn from_transformers(f: &JsonFields) -> Result<(Self, HfExtras), ModelError> {
        let d_model = f.usize_or("hidden_size", 4096)?;
        let expand = f.usize_or("expand", 2)?;
        let headdim = f.usize_or("head_dim", 64)?;
        let num_heads = f.usize_or("num_heads", 128)?;
        if num_heads * headdim != expand * d_model {
            return Err(ModelError::HfConfig {
                why: format!("num_heads {num_heads} * head_dim {headdim} != expand {expand} * hidden_size {d_model}"),
            });
        }
        if !f.bool_or("rms_norm", true)? {
            return Err(ModelError::HfConfig { why: "rms_norm = false (a LayerNorm model) is not supported".into() });
        }
        let (lo, hi) = f.pair_or("time_step_limit", (0.0, f64::INFINITY))?;
        let config = Mamba2Config::new(d_model, f.usize_or("num_hidden_layers", 64)?)
            .with_d_state(f.usize_or("state_size", 128)?)
            .with_d_conv(f.usize_or("conv_kernel", 4)?)
            .with_expand(expand)
            .with_headdim(headdim)
            .with_ngroups(f.usize_or("n_groups", 8)?)
            .with_chunk_size(f.usize_or("chunk_size", 256)?)
            .with_dt_min(f.f64_or("time_step_min", 1e-3)?)
            .with_dt_max(f.f64_or("time_step_max", 0.1)?)
            .with_dt_init_floor(f.f64_or("time_step_floor", 1e-4)?)
            .with_dt_limit_lo(lo)
            .with_dt_limit_hi(if hi >= 1e308 { None } else { Some(hi) })
            .with_bias(f.bool_or("use_bias", false)?)
            .with_conv_bias(f.bool_or("use_conv_bias", true)?)
            .with_norm_eps(f.f64_or("layer_norm_epsilon", 1e-5)?)
            .with_residual_in_fp32(f.bool_or("residual_in_fp32", true)?)
            .with_rescale_prenorm_residual(f.bool_or("rescale_prenorm_residual", false)?);
        config.validate()?;
        let extras = HfExtras {
            vocab_size: f.usize_or("vocab_size", 32768)?,
            tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
            eos_token_ids: f.token_ids("eos_token_id")?,
        };
        Ok((config, extras))
    }

    /// mamba_ssm's form: `MambaConfig` with the layer's own keys in `ssm_cfg`, whose defaults
    /// are `mamba_ssm.modules.mamba2.Mamba2.__init__`'s. The vocabulary is padded up to a
    /// multiple of `pad_vocab_size_multiple`, as `MambaLMHeadModel` does.
    fn from_mamba_ssm(f: &JsonFields) -> Result<(Self, HfExtras), ModelError> {
        let unsupported = |why: String| Err(ModelError::HfConfig { why });
        let empty = serde_json::Value::Object(Default::default());
        let s = JsonFields::new(f.get("ssm_cfg").unwrap_or(&empty), "ssm_cfg.")?;
        // MambaLMHeadModel builds Mamba-1 layers unless ssm_cfg names another layer.
        let layer = match s.get("layer") {
            None => "Mamba1",
            Some(x) => x.as_str().ok_or_else(|| ModelError::HfConfig { why: format!("ssm_cfg.layer is not a string: {x}") })?,
        };
        if layer != "Mamba2" {
            return unsupported(format!("ssm_cfg.layer {layer:?} is not a Mamba-2 layer (only \"Mamba2\" is supported)"));
        }
        if f.usize_or("d_intermediate", 0)? != 0 {
            return unsupported("d_intermediate > 0 (an MLP after each mixer) is not supported".into());
        }
        if f.get("attn_layer_idx").and_then(|x| x.as_array()).is_some_and(|a| !a.is_empty()) {
            return unsupported("attention layers (attn_layer_idx) are not supported".into());
        }
        if !f.bool_or("rms_norm", true)? || !s.bool_or("rmsnorm", true)? {
            return unsupported("rms_norm = false (a LayerNorm model) is not supported".into());
        }
        let d_model = f.usize_or("d_model", 2560)?;
        let expand = s.usize_or("expand", 2)?;
        if let Some(d_ssm) = s.get("d_ssm").filter(|x| !x.is_null()) {
            if d_ssm.as_u64() != Some((expand * d_model) as u64) {
                return unsupported(format!("ssm_cfg.d_ssm {d_ssm} differs from expand * d_model = {} (a partial SSM)", expand * d_model));
            }
        }
        let (lo, hi) = s.pair_or("dt_limit", (0.0, f64::INFINITY))?;
        let a_init_range = s.pair_or("A_init_range", (1.0, 16.0))?;
        let config = Mamba2Config::new(d_model, f.usize_or("n_layer", 64)?)
            .with_d_state(s.usize_or("d_state", 128)?)
            .with_d_conv(s.usize_or("d_conv", 4)?)
            .with_expand(expand)
            .with_headdim(s.usize_or("headdim", 64)?)
            .with_ngroups(s.usize_or("ngroups", 1)?)
            .with_chunk_size(s.usize_or("chunk_size", 256)?)
            .with_dt_min(s.f64_or("dt_min", 1e-3)?)
            .with_dt_max(s.f64_or("dt_max", 0.1)?)
            .with_dt_init_floor(s.f64_or("dt_init_floor", 1e-4)?)
            .with_dt_limit_lo(lo)
            .with_dt_limit_hi(if hi >= 1e308 { None } else { Some(hi) })
            .with_a_init_range(a_init_range)
            .with_bias(s.bool_or("bias", false)?)
            .with_conv_bias(s.bool_or("conv_bias", true)?)
            .with_norm_before_gate(s.bool_or("norm_before_gate", false)?)
            .with_d_has_hdim(s.bool_or("D_has_hdim", false)?)
            .with_norm_eps(1e-5)
            .with_residual_in_fp32(f.bool_or("residual_in_fp32", true)?)
            .with_rescale_prenorm_residual(true);
        config.validate()?;
        let (vocab, multiple) = (f.usize_or("vocab_size", 50277)?, f.usize_or("pad_vocab_size_multiple", 8)?.max(1));
        let extras = HfExtras {
            vocab_size: vocab.div_ceil(multiple) * multiple,
            tie_word_embeddings: f.bool_or("tie_embeddings", true)?,
            eos_token_ids: f.token_ids("eos_token_id")?,
        };
        Ok((config, extras))
    }
}

/// The keys of one JSON object of a config, read with defaults; errors name the key with its
/// path (`ssm_cfg.d_state`).
struct JsonFields<'a> {
    map: &'a serde_json::Map<String, serde_json::Value>,
    path: &'static str,
}

impl<'a> JsonFields<'a> {
    fn new(v: &'a serde_json::Value, path: &'static str) -> Result<Self, ModelError> {
        let map = v.as_object().ok_or_else(|| ModelError::HfConfig { why: format!("{path}{{...}} is not a JSON object: {v}") })?;
        Ok(Self { map, path })
    }

    fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// The value of `key`; JSON `null` counts as missing, as Python writes `None` that way.
    fn get(&self, key: &str) -> Option<&'a serde_json::Value> {
        self.map.get(key).filter(|x| !x.is_null())
    }

    fn wrong(&self, key: &str, kind: &str, x: &serde_json::Value) -> ModelError {
        ModelError::HfConfig { why: format!("`{}{key}` must be {kind}, got {x}", self.path) }
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize, ModelError> {
        self.get(key).map_or(Ok(default), |x| x.as_u64().map(|x| x as usize).ok_or_else(|| self.wrong(key, "a whole number", x)))
    }

    fn f64_or(&self, key: &str, default: f64) -> Result<f64, ModelError> {
        self.get(key).map_or(Ok(default), |x| loose_f64(x).ok_or_else(|| self.wrong(key, "a number", x)))
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, ModelError> {
        self.get(key).map_or(Ok(default), |x| x.as_bool().ok_or_else(|| self.wrong(key, "true or false", x)))
    }

    /// A token id or a list of them (HF writes both for `eos_token_id`); none when missing.
    fn token_ids(&self, key: &str) -> Result<Vec<usize>, ModelError> {
        let Some(x) = self.get(key) else { return Ok(Vec::new()) };
        let ids = match x.as_array() {
            Some(a) => a.iter().map(|i| i.as_u64()).collect::<Option<Vec<_>>>(),
            None => x.as_u64().map(|i| vec![i]),
        };
        ids.map(|ids| ids.into_iter().map(|i| i as usize).collect()).ok_or_else(|| self.wrong(key, "a token id or a list of them", x))
    }

    fn pair_or(&self, key: &str, default: (f64, f64)) -> Result<(f64, f64), ModelError> {
        let Some(x) = self.get(key) else { return Ok(default) };
        match x.as_array().map(|a| a.iter().map(loose_f64).collect::<Vec<_>>()).as_deref() {
            Some([Some(lo), Some(hi)]) => Ok((*lo, *hi)),
            _ => Err(self.wrong(key, "a pair of numbers", x)),
        }
    }
}

/// A number, also in the forms Python's and transformers 5's JSON give to infinities (bare
/// `Infinity`, read here as 1e308, and `{"__float__": "Infinity"}`).
fn loose_f64(x: &serde_json::Value) -> Option<f64> {
    x.as_f64().or_else(|| match x.get("__float__")?.as_str()? {
        "Infinity" | "inf" => Some(f64::INFINITY),
        "-Infinity" | "-inf" => Some(f64::NEG_INFINITY),
        _ => None,
    })
}

/// What an HF config says beyond the stack itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfExtras {
    /// Rows of the embedding.
    pub vocab_size: usize,
    /// Whether `lm_head` is the embedding itself.
    pub tie_word_embeddings: bool,
    /// The tokens that end a text (`eos_token_id`, one id or a list; none when absent).
    /// [`load_hf_lm`](crate::load_hf_lm) takes them from `generation_config.json` when that file
    /// names some, as HF's `generate` does.
    pub eos_token_ids: Vec<usize>,
}

/// The `eos_token_id` of a `generation_config.json` text; `None` when it names none.
pub(crate) fn generation_eos(text: &str) -> Result<Option<Vec<usize>>, ModelError> {
    let v: serde_json::Value = serde_json::from_str(&bare_infinity_to_number(text))
        .map_err(|e| ModelError::HfConfig { why: format!("generation_config.json is not JSON: {e}") })?;
    let ids = JsonFields::new(&v, "")?.token_ids("eos_token_id")?;
    Ok((!ids.is_empty()).then_some(ids))
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

    /// Keys missing from an HF config take `transformers.Mamba2Config`'s defaults (untied head,
    /// 8 groups, chunks of 256 ...), as HF reads the same file.
    #[test]
    fn an_hf_config_takes_hf_defaults_for_missing_keys() {
        let (c, extras) =
            Mamba2Config::from_hf_json(r#"{"hidden_size": 64, "num_heads": 2, "num_hidden_layers": 3, "n_groups": 1}"#).unwrap();
        assert_eq!(
            (c.d_model, c.n_layer, c.headdim, c.expand, c.d_state, c.d_conv, c.ngroups, c.chunk_size),
            (64, 3, 64, 2, 128, 4, 1, 256)
        );
        assert_eq!(extras, HfExtras { vocab_size: 32768, tie_word_embeddings: false, eos_token_ids: Vec::new() });
        for (eos, want) in [("0", vec![0]), ("[2, 5]", vec![2, 5]), ("null", vec![])] {
            let (_, extras) =
                Mamba2Config::from_hf_json(&format!(r#"{{"hidden_size": 64, "num_heads": 2, "n_groups": 1, "eos_token_id": {eos}}}"#))
                    .unwrap();
            assert_eq!(extras.eos_token_ids, want, "eos_token_id {eos}");
        }
        let e = Mamba2Config::from_hf_json(r#"{"hidden_size": 64, "num_heads": 2, "n_groups": 1, "eos_token_id": "</s>"}"#).unwrap_err();
        assert_eq!(e.to_string(), r#"HF config: `eos_token_id` must be a token id or a list of them, got "</s>""#);
        assert!(!c.bias && c.conv_bias && !c.norm_before_gate && c.dt_limit_hi.is_none());
        let (_, tied) =
            Mamba2Config::from_hf_json(r#"{"hidden_size": 64, "num_heads": 2, "n_groups": 2, "tie_word_embeddings": true}"#).unwrap();
        assert!(tied.tie_word_embeddings);
        // A key that is present with the wrong kind of value is an error naming it.
        let err = Mamba2Config::from_hf_json(r#"{"hidden_size": 64, "num_heads": 2, "n_groups": 1, "state_size": "16"}"#).unwrap_err();
        assert_eq!(err.to_string(), r#"HF config: `state_size` must be a whole number, got "16""#);
    }

    /// mamba_ssm's form: the layer's keys under `ssm_cfg`, mamba_ssm's defaults, the padded
    /// vocabulary; and a Mamba-1 or hybrid config is refused by name.
    #[test]
    fn a_mamba_ssm_config_is_read_with_mamba_ssm_defaults() {
        let text = r#"{"d_model": 768, "n_layer": 24, "vocab_size": 50277, "ssm_cfg": {"layer": "Mamba2"}, "rms_norm": true,
            "residual_in_fp32": true, "fused_add_norm": true, "pad_vocab_size_multiple": 16, "tie_embeddings": true}"#;
        let (c, extras) = Mamba2Config::from_hf_json(text).unwrap();
        assert_eq!((c.d_model, c.n_layer, c.headdim, c.d_state, c.ngroups, c.chunk_size, c.nheads()), (768, 24, 64, 128, 1, 256, 24));
        assert_eq!(extras, HfExtras { vocab_size: 50288, tie_word_embeddings: true, eos_token_ids: Vec::new() });
        let mamba1 = Mamba2Config::from_hf_json(r#"{"d_model": 768, "n_layer": 24, "ssm_cfg": {}}"#).unwrap_err();
        assert!(mamba1.to_string().contains("\"Mamba1\""), "{mamba1}");
        let hybrid =
            Mamba2Config::from_hf_json(r#"{"d_model": 768, "n_layer": 24, "ssm_cfg": {"layer": "Mamba2"}, "attn_layer_idx": [3]}"#);
        assert!(hybrid.unwrap_err().to_string().contains("attn_layer_idx"));
        let wrong = Mamba2Config::from_hf_json(r#"{"d_model": 768, "n_layer": 24, "ssm_cfg": {"layer": "Mamba2", "headdim": 64.5}}"#);
        assert!(wrong.unwrap_err().to_string().contains("`ssm_cfg.headdim`"));
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
