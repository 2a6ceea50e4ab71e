//! Which models are served under which names, and each one's state: the model
//! repository's bookkeeping, pure (generic over the handle) and unit-tested directly.
//!
//! A model (a folder of the repository, or the one model of a plain `serve`) answers to
//! several names: Triton's TensorRT-LLM layout gives one LLM an `ensemble` and a
//! `tensorrt_llm_bls` (text in, text out) and a `tensorrt_llm` (token ids in and out).
//! Loading a model that serves already starts a second instance beside it and swaps it
//! in when ready, so its names never stop answering; unloading takes its names out of
//! routing at once and hands the old instance back to be drained.

use std::collections::BTreeMap;

/// How a served name takes its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// text_input → text_output.
    Text,
    /// input_ids → output_ids.
    Ids,
}

/// The names one model answers to, each with its kind.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Names(pub Vec<(String, ModelKind)>);

impl Names {
    fn kind_of(&self, name: &str) -> Option<ModelKind> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, k)| *k)
    }

    /// The token-ids name (the core model's, TRT-LLM's `tensorrt_llm`), if there is one.
    pub fn core(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(_, k)| *k == ModelKind::Ids)
            .map(|(n, _)| n.as_str())
    }

    /// The names, in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| n.as_str())
    }
}

/// A model's state, as the repository index reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Serving.
    Ready,
    /// Being loaded; not serving yet.
    Loading,
    /// Not serving: never loaded, unloaded, or its load failed (the reason says).
    Unavailable,
}

impl State {
    /// Triton's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Ready => "READY",
            State::Loading => "LOADING",
            State::Unavailable => "UNAVAILABLE",
        }
    }
}

/// Why a name does not route to a serving model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// No model answers to the name.
    Unknown(String),
    /// The name's model is not serving (loading, unloaded, failed): the message says.
    NotReady(String),
}

/// Why a load or an unload cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeError {
    /// No such model.
    Unknown(String),
    /// The change conflicts with the model's state or with another model's names, or the
    /// load itself failed: the message says.
    Refused(String),
}

impl std::fmt::Display for ChangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChangeError::Unknown(m) | ChangeError::Refused(m) => f.write_str(m),
        }
    }
}

/// One row of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexRow {
    /// The name (a model's, or one of the names it answers to).
    pub name: String,
    /// Its model's state.
    pub state: State,
    /// Why it is unavailable, or empty.
    pub reason: String,
}

#[derive(Debug, Clone)]
struct Entry<H> {
    names: Names,
    /// The names a load in progress will serve under.
    pending: Option<Names>,
    /// Instances replaced or unloaded that still finish their running requests.
    draining: Vec<H>,
    /// The serving instance.
    serving: Option<H>,
    /// A load in progress (of a first instance, or of one to replace `serving`).
    loading: bool,
    reason: String,
}

/// Every model's names and state.
#[derive(Debug, Clone)]
pub struct Registry<H> {
    models: BTreeMap<String, Entry<H>>,
}

impl<H> Default for Registry<H> {
    fn default() -> Self {
        Registry {
            models: BTreeMap::new(),
        }
    }
}

impl<H: Clone + PartialEq> Registry<H> {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The serving model behind `name` and the kind of input the name takes (a name an
    /// unloaded model had and a serving one took since routes to the serving one).
    pub fn route(&self, name: &str) -> Result<(H, ModelKind), RouteError> {
        let serving = self.models.values().find_map(|e| {
            let kind = e.names.kind_of(name)?;
            e.serving.clone().map(|h| (h, kind))
        });
        if let Some(found) = serving {
            return Ok(found);
        }
        for (model, e) in &self.models {
            if e.names.kind_of(name).is_none() {
                continue;
            }
            // Not serving (a serving match returned above).
            let why = match e.loading {
                true => format!("'{model}' is loading"),
                false if e.reason.is_empty() => format!("'{model}' is unavailable"),
                false => format!("'{model}' is unavailable ({})", e.reason),
            };
            return Err(RouteError::NotReady(format!(
                "model '{name}' is not ready: {why}"
            )));
        }
        Err(RouteError::Unknown(name.to_string()))
    }

    /// The composing model of a text name, as Triton counts an ensemble's requests: the
    /// token-ids name of the same model (None for a token-ids name, or a model without one).
    pub fn composing_of(&self, name: &str) -> Option<String> {
        let e = self
            .models
            .values()
            .filter(|e| e.names.kind_of(name).is_some())
            .max_by_key(|e| e.serving.is_some())?;
        if e.names.kind_of(name) != Some(ModelKind::Text) {
            return None;
        }
        e.names.core().map(str::to_string)
    }

    /// Whether `model` is a model of the registry (by its own name, not an alias).
    pub fn contains(&self, model: &str) -> bool {
        self.models.contains_key(model)
    }

    /// The model that answers to `name`.
    pub fn model_of(&self, name: &str) -> Option<&str> {
        self.models
            .iter()
            .find(|(_, e)| e.names.kind_of(name).is_some())
            .map(|(m, _)| m.as_str())
    }

    /// Starts loading `model` under `names` (declaring it when new; its names may change
    /// on a reload). Refused while it is loading already or when another model answers to
    /// one of the names.
    pub fn begin_load(&mut self, model: &str, names: Names) -> Result<(), ChangeError> {
        for (other, e) in &self.models {
            // Only models that serve or are loading hold their names.
            if other == model || (e.serving.is_none() && !e.loading) {
                continue;
            }
            let holds = |n: &str| {
                e.names.kind_of(n).is_some()
                    || e.pending.as_ref().is_some_and(|p| p.kind_of(n).is_some())
            };
            if let Some(n) = names.iter().find(|n| holds(n)) {
                return Err(ChangeError::Refused(format!(
                    "model '{model}' cannot be served as '{n}': model '{other}' is"
                )));
            }
        }
        let e = self.models.entry(model.to_string()).or_insert(Entry {
            names: Names::default(),
            pending: None,
            draining: Vec::new(),
            serving: None,
            loading: false,
            reason: String::new(),
        });
        if e.loading {
            return Err(ChangeError::Refused(format!(
                "model '{model}' is being loaded already"
            )));
        }
        e.loading = true;
        e.reason.clear();
        if e.serving.is_none() {
            e.names = names.clone();
        }
        e.pending = Some(names);
        Ok(())
    }

    /// Ends the load that [`begin_load`](Self::begin_load) started: on success the new
    /// instance serves under `names` and the one it replaces (if any) is returned to be
    /// drained; on failure the model keeps serving its old instance, if it had one.
    pub fn finish_load(
        &mut self,
        model: &str,
        names: Names,
        loaded: Result<H, String>,
    ) -> Option<H> {
        let e = self.models.get_mut(model)?;
        e.loading = false;
        e.pending = None;
        match loaded {
            Ok(h) => {
                e.names = names;
                e.reason.clear();
                let old = e.serving.replace(h);
                e.draining.extend(old.clone());
                old
            }
            Err(why) => {
                e.reason = why;
                None
            }
        }
    }

    /// Takes `model` out of routing; returns its instance to be drained (None when it
    /// was not serving). Refused while it is loading.
    pub fn unload(&mut self, model: &str) -> Result<Option<H>, ChangeError> {
        let e = self.models.get_mut(model).ok_or_else(|| {
            ChangeError::Unknown(format!("model '{model}' is not in the repository"))
        })?;
        if e.loading {
            return Err(ChangeError::Refused(format!(
                "model '{model}' is being loaded; unload it once the load ends"
            )));
        }
        e.reason = "unloaded".into();
        let old = e.serving.take();
        e.draining.extend(old.clone());
        Ok(old)
    }

    /// Every instance of the model that answers to `name`: the serving one and those
    /// still draining (a stop request must reach the one running its target).
    pub fn instances(&self, name: &str) -> Vec<H> {
        self.models
            .values()
            .filter(|e| e.names.kind_of(name).is_some())
            .flat_map(|e| e.serving.iter().chain(&e.draining).cloned())
            .collect()
    }

    /// Forgets `old`, a drained instance of `model`.
    pub fn drained(&mut self, model: &str, old: &H) {
        if let Some(e) = self.models.get_mut(model) {
            e.draining.retain(|h| h != old);
        }
    }

    /// Every model's row, by model name; with `names`, one row per name it answers to
    /// besides its own.
    pub fn index(&self, names: bool) -> Vec<IndexRow> {
        let mut rows = Vec::new();
        for (model, e) in &self.models {
            let state = match (&e.serving, e.loading) {
                (Some(_), _) => State::Ready,
                (None, true) => State::Loading,
                (None, false) => State::Unavailable,
            };
            let row = |name: &str| IndexRow {
                name: name.to_string(),
                state,
                reason: e.reason.clone(),
            };
            rows.push(row(model));
            if names {
                rows.extend(e.names.iter().filter(|n| n != model).map(row));
            }
        }
        rows
    }

    /// Every name a serving model answers to, each once.
    pub fn names(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for e in self.models.values().filter(|e| e.serving.is_some()) {
            for n in e.names.iter() {
                if !out.iter().any(|o| o == n) {
                    out.push(n.to_string());
                }
            }
        }
        out
    }

    /// The serving instances with their model names and names.
    pub fn serving(&self) -> Vec<(String, Names, H)> {
        self.models
            .iter()
            .filter_map(|(m, e)| e.serving.clone().map(|h| (m.clone(), e.names.clone(), h)))
            .collect()
    }

    /// Whether every model that is not unloaded on purpose serves.
    pub fn all_ready(&self) -> bool {
        self.models
            .values()
            .all(|e| e.serving.is_some() || (!e.loading && e.reason == "unloaded"))
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
