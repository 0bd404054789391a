use crate::plan::{self, Extent, Fault, FaultKind, ROTATION, Shape};
use crate::rng::Rng;
use crate::stats::drift;
use crate::{Budget, Config, Part, parse};

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

#[test]
fn a_seed_replays_the_same_choices_and_bounds_hold() {
    let mut a = Rng::new(42);
    let mut b = Rng::new(42);
    let xs: Vec<u64> = (0..100).map(|_| a.below(7)).collect();
    let ys: Vec<u64> = (0..100).map(|_| b.below(7)).collect();
    assert_eq!(xs, ys);
    assert!(xs.iter().all(|&x| x < 7));
    for v in 0..7 {
        assert!(xs.contains(&v), "{v} never drawn in {xs:?}");
    }
    let zs: Vec<u64> = {
        let mut c = Rng::new(43);
        (0..100).map(|_| c.below(7)).collect()
    };
    assert_ne!(xs, zs, "another seed draws another sequence");
    assert!((0..1000).all(|_| (3..=5).contains(&a.between(3, 5))));
}

#[test]
fn the_rotation_draws_every_kind_and_failpoint_with_the_first_and_last_commit() {
    let mut rng = Rng::new(7);
    let extent = Extent {
        commits: 15,
        events: 40,
    };
    let faults: Vec<Fault> = (0..ROTATION)
        .map(|slot| plan::draw(&mut rng, Some(slot), Shape::Loop5, extent))
        .collect();
    let kinds: Vec<FaultKind> = faults.iter().map(|f| f.kind()).collect();
    for kind in FaultKind::ALL {
        assert!(kinds.contains(&kind), "{kind:?} missing from {faults:?}");
    }
    let stores: Vec<(u32, awaken_store::FailPoint)> = faults
        .iter()
        .filter_map(|f| match f {
            Fault::Store { at_commit, point } => Some((*at_commit, *point)),
            _ => None,
        })
        .collect();
    let points: Vec<_> = stores.iter().map(|(_, p)| *p).collect();
    assert_eq!(points, awaken_store::FailPoint::all());
    assert_eq!(
        stores[0].0, 1,
        "the first store fault fails the first commit"
    );
    assert_eq!(stores[3].0, 15, "the last fails the last commit");
}

#[test]
fn random_faults_land_inside_the_run() {
    let mut rng = Rng::new(11);
    let extent = Extent {
        commits: 9,
        events: 30,
    };
    for _ in 0..10_000 {
        let shape = Shape::draw(&mut rng);
        match plan::draw(&mut rng, None, shape, extent) {
            Fault::Cancel { at_event } => assert!(at_event <= 30),
            Fault::Store { at_commit, .. } => assert!((1..=9).contains(&at_commit)),
            Fault::Retryable { step, .. }
            | Fault::Permanent { step }
            | Fault::MidStream { step }
            | Fault::StallCancel { step, .. }
            | Fault::StallTimeout { step, .. }
            | Fault::StallDrop { step, .. } => assert!(step < shape.steps()),
            Fault::None => {}
        }
    }
}

#[test]
fn arguments_parse_or_say_what_is_wrong() {
    assert_eq!(
        parse(&args(&["--minutes", "2.5", "--seed", "9"])).expect("valid"),
        Config {
            budget: Budget::Minutes(2.5),
            seed: 9,
            only: None
        }
    );
    assert_eq!(
        parse(&args(&["--only", "kills"])).expect("valid").only,
        Some(Part::Kills)
    );
    assert_eq!(
        parse(&args(&["--quick", "--seed", "1"]))
            .expect("valid")
            .budget,
        Budget::Quick
    );
    assert_eq!(
        parse(&args(&["--runs", "1000"])).expect("valid").budget,
        Budget::Runs(1000)
    );
    assert_eq!(
        parse(&[]).expect("valid").budget,
        Budget::Minutes(10.0),
        "ten minutes by default"
    );
    let error = |words: &[&str]| format!("{:#}", parse(&args(words)).expect_err("refused"));
    assert_eq!(
        error(&["--runs", "0"]),
        "`--runs 0`: not a positive whole number"
    );
    assert_eq!(
        error(&["--minutes", "-1"]),
        "`--minutes -1`: not a positive number"
    );
    assert_eq!(error(&["--seed"]), "`--seed` needs a seed");
    assert_eq!(
        error(&["--seed", "x"]),
        "`--seed x`: not a whole number: invalid digit found in string"
    );
    assert_eq!(
        error(&["--quick", "--runs", "5"]),
        "give one of --minutes, --runs and --quick"
    );
    assert_eq!(
        error(&["--only", "postgres"]),
        "`--only postgres`: the parts are memory, sqlite and kills"
    );
    assert_eq!(error(&["--fast"]), "unknown argument `--fast`");
}

#[test]
fn drift_is_measured_from_the_first_sample_after_the_warm_up() {
    let samples = [(10, 500), (20, 1000), (30, 1010), (40, 1030)];
    let dipped = [(10, 500), (20, 1000), (30, 990), (40, 1030)];
    assert_eq!(drift(&dipped, 20).expect("drift").range, (990, 1030));
    let d = drift(&samples, 20).expect("two samples after the warm-up");
    assert_eq!((d.at_warm_up, d.at_end), (1000, 1030));
    assert_eq!(d.range, (1000, 1030));
    assert!((d.percent - 3.0).abs() < 1e-9, "{}", d.percent);
    assert!(drift(&samples, 40).is_none(), "one sample is no drift");
    assert!(drift(&samples, 50).is_none());
}
