//! The registry's routing and load/unload transitions.

use super::*;

fn names(model: &str, extra: &[(&str, ModelKind)]) -> Names {
    let mut v = vec![(model.to_string(), ModelKind::Text)];
    v.extend(extra.iter().map(|(n, k)| (n.to_string(), *k)));
    Names(v)
}

fn loaded(r: &mut Registry<u32>, model: &str, n: Names, h: u32) {
    r.begin_load(model, n.clone()).unwrap();
    assert_eq!(r.finish_load(model, n, Ok(h)), None);
}

#[test]
fn routes_every_name_to_its_model_with_its_kind() {
    let mut r = Registry::new();
    let a = names(
        "a",
        &[
            ("ensemble", ModelKind::Text),
            ("tensorrt_llm", ModelKind::Ids),
        ],
    );
    loaded(&mut r, "a", a, 1);
    loaded(&mut r, "b", names("b", &[]), 2);
    assert_eq!(r.route("a"), Ok((1, ModelKind::Text)));
    assert_eq!(r.route("tensorrt_llm"), Ok((1, ModelKind::Ids)));
    assert_eq!(r.route("b"), Ok((2, ModelKind::Text)));
    assert_eq!(r.route("c"), Err(RouteError::Unknown("c".into())));
    assert_eq!(r.model_of("ensemble"), Some("a"));
    assert_eq!(r.names(), ["a", "ensemble", "tensorrt_llm", "b"]);
    assert!(r.all_ready());
}

#[test]
fn a_name_taken_by_another_model_is_refused() {
    let mut r = Registry::new();
    loaded(&mut r, "a", names("a", &[("ensemble", ModelKind::Text)]), 1);
    let err = r
        .begin_load("b", names("b", &[("ensemble", ModelKind::Text)]))
        .unwrap_err();
    assert!(
        matches!(err, ChangeError::Refused(m) if m.contains("'ensemble'") && m.contains("'a'"))
    );
    assert!(!r.contains("b"));
    // A model's own name counts too.
    assert!(r
        .begin_load("b", names("b", &[("a", ModelKind::Text)]))
        .is_err());
}

#[test]
fn unload_stops_routing_at_once_and_returns_the_instance() {
    let mut r = Registry::new();
    loaded(&mut r, "a", names("a", &[]), 1);
    loaded(&mut r, "b", names("b", &[]), 2);
    assert_eq!(r.unload("a"), Ok(Some(1)));
    assert!(matches!(r.route("a"), Err(RouteError::NotReady(m)) if m.contains("unloaded")));
    assert_eq!(r.route("b"), Ok((2, ModelKind::Text)));
    // Unloaded on purpose: the server is still ready; a second unload hands back nothing.
    assert!(r.all_ready());
    assert_eq!(r.unload("a"), Ok(None));
    assert!(matches!(r.unload("zz"), Err(ChangeError::Unknown(_))));
    let idx = r.index(false);
    assert_eq!(idx[0].state, State::Unavailable);
    assert_eq!(idx[0].reason, "unloaded");
    assert_eq!(idx[1].state, State::Ready);
    // Loaded again: serves again.
    loaded(&mut r, "a", names("a", &[]), 3);
    assert_eq!(r.route("a"), Ok((3, ModelKind::Text)));
}

#[test]
fn a_reload_keeps_serving_the_old_instance_until_the_new_one_is_ready() {
    let mut r = Registry::new();
    loaded(&mut r, "a", names("a", &[]), 1);
    r.begin_load("a", names("a", &[("x", ModelKind::Ids)]))
        .unwrap();
    assert_eq!(r.route("a"), Ok((1, ModelKind::Text)));
    assert!(
        r.route("x").is_err(),
        "new names answer once the new instance serves"
    );
    assert_eq!(r.index(false)[0].state, State::Ready);
    assert!(matches!(
        r.begin_load("a", names("a", &[])),
        Err(ChangeError::Refused(_))
    ));
    assert!(matches!(r.unload("a"), Err(ChangeError::Refused(_))));
    let old = r.finish_load("a", names("a", &[("x", ModelKind::Ids)]), Ok(2));
    assert_eq!(old, Some(1));
    assert_eq!(r.route("x"), Ok((2, ModelKind::Ids)));
}

#[test]
fn a_failed_load_leaves_the_model_unavailable_with_the_reason() {
    let mut r = Registry::<u32>::new();
    r.begin_load("a", names("a", &[])).unwrap();
    assert!(matches!(r.route("a"), Err(RouteError::NotReady(m)) if m.contains("loading")));
    assert_eq!(r.index(false)[0].state, State::Loading);
    assert!(!r.all_ready());
    r.finish_load("a", names("a", &[]), Err("no config.json".into()));
    let row = &r.index(false)[0];
    assert_eq!(
        (row.state, row.reason.as_str()),
        (State::Unavailable, "no config.json")
    );
    assert!(matches!(r.route("a"), Err(RouteError::NotReady(m)) if m.contains("no config.json")));
    assert!(!r.all_ready());
    // A failed reload keeps the old instance serving.
    loaded(&mut r, "b", names("b", &[]), 7);
    r.begin_load("b", names("b", &[])).unwrap();
    assert_eq!(r.finish_load("b", names("b", &[]), Err("oom".into())), None);
    assert_eq!(r.route("b"), Ok((7, ModelKind::Text)));
}

#[test]
fn the_index_lists_aliases_only_when_asked() {
    let mut r = Registry::new();
    loaded(&mut r, "a", names("a", &[("ensemble", ModelKind::Text)]), 1);
    let short: Vec<_> = r.index(false).into_iter().map(|x| x.name).collect();
    let long: Vec<_> = r.index(true).into_iter().map(|x| x.name).collect();
    assert_eq!(short, ["a"]);
    assert_eq!(long, ["a", "ensemble"]);
    assert_eq!(r.serving().len(), 1);
}

#[test]
fn an_unloaded_models_names_are_free_and_not_listed() {
    let mut r = Registry::new();
    loaded(&mut r, "a", names("a", &[("ensemble", ModelKind::Text)]), 1);
    r.unload("a").unwrap();
    assert_eq!(r.names(), Vec::<String>::new());
    // Another model takes the alias the unloaded one had, and routing finds it.
    loaded(&mut r, "b", names("b", &[("ensemble", ModelKind::Text)]), 2);
    assert_eq!(r.route("ensemble"), Ok((2, ModelKind::Text)));
    // a cannot come back under a name b now serves.
    let clash = r.begin_load("a", names("a", &[("ensemble", ModelKind::Text)]));
    assert!(matches!(clash, Err(ChangeError::Refused(_))));
}

#[test]
fn names_a_reload_is_bringing_are_held_while_it_loads() {
    let mut r = Registry::new();
    loaded(&mut r, "a", names("a", &[]), 1);
    r.begin_load("a", names("a", &[("x", ModelKind::Text)]))
        .unwrap();
    // b cannot claim x while a's reload that brings it is under way.
    assert!(matches!(
        r.begin_load("b", names("b", &[("x", ModelKind::Text)])),
        Err(ChangeError::Refused(_))
    ));
}

#[test]
fn a_text_names_composing_model_is_its_token_ids_name() {
    let mut r = Registry::new();
    let n = names("a", &[("e", ModelKind::Text), ("core", ModelKind::Ids)]);
    loaded(&mut r, "a", n, 1);
    loaded(&mut r, "b", names("b", &[]), 2);
    assert_eq!(r.composing_of("e").as_deref(), Some("core"));
    assert_eq!(r.composing_of("a").as_deref(), Some("core"));
    assert_eq!(r.composing_of("core"), None);
    assert_eq!(r.composing_of("b"), None);
}

#[test]
fn replaced_and_unloaded_instances_drain_until_told() {
    let mut r = Registry::new();
    loaded(&mut r, "a", names("a", &[("x", ModelKind::Text)]), 1);
    r.begin_load("a", names("a", &[("x", ModelKind::Text)]))
        .unwrap();
    assert_eq!(
        r.finish_load("a", names("a", &[("x", ModelKind::Text)]), Ok(2)),
        Some(1)
    );
    // A stop request must reach both: 1 may still run its target.
    assert_eq!(r.instances("x"), [2, 1]);
    r.drained("a", &1);
    assert_eq!(r.instances("a"), [2]);
    assert_eq!(r.unload("a"), Ok(Some(2)));
    assert_eq!(r.instances("a"), [2]);
    r.drained("a", &2);
    assert!(r.instances("a").is_empty());
    assert!(r.instances("nope").is_empty());
}
