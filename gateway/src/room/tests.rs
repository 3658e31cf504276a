use super::*;

fn live(state: QueueState, seq: u64, head: u64) -> Live {
    Live {
        settings: Settings { state, ..Settings::DEFAULT },
        counts: Counts { seq, head, ..Counts::default() },
        median_wait_ms: None,
        admitted_last_minute: 0,
        outflow: Outflow::default(),
        schedule: Vec::new(),
        eta_error: None,
        redis_ms: 1_000_000,
        read_at: Instant::now(),
    }
}

fn history(batches: &[&str], skipped: &[u64]) -> History {
    let mut h = History::default();
    for b in batches {
        let batch = Batch::parse(b).expect("batch");
        h.batches.insert(batch.to, batch);
    }
    h.skipped.extend(skipped);
    h
}

#[test]
fn a_place_is_waiting_admitted_lapsed_or_ended() {
    let live = live(QueueState::Open, 20, 10);
    let h = history(&["0:4:1000:4", "4:10:2000:5"], &[7]);
    let now = 3000;
    assert_eq!(standing(&live, &h, 11, now), Standing::Waiting { position: 1 });
    assert_eq!(standing(&live, &h, 20, now), Standing::Waiting { position: 10 });
    assert_eq!(standing(&live, &h, 4, now), Standing::Admitted { at_ms: 1000, until_ms: 901_000 });
    assert_eq!(standing(&live, &h, 5, now), Standing::Admitted { at_ms: 2000, until_ms: 902_000 });
    assert_eq!(standing(&live, &h, 7, now), Standing::Lapsed);
    assert_eq!(standing(&live, &h, 1, 901_000), Standing::SessionEnded);
}

#[test]
fn pre_queue_tickets_wait_until_the_draw() {
    let h = History::default();
    assert!(matches!(standing(&live(QueueState::Prequeue, 0, 0), &h, 0, 0), Standing::Prequeue { .. }));
    assert_eq!(standing(&live(QueueState::Open, 5, 0), &h, 0, 0), Standing::Drawn);
}

#[test]
fn batches_parse_strictly() {
    assert_eq!(
        Batch::parse("3:9:1700000000000:5"),
        Some(Batch { from: 3, to: 9, at_ms: 1_700_000_000_000, admitted: 5 })
    );
    for bad in ["", "1:2:3", "1:2:3:4:5", "9:3:1:1", "a:b:c:d", "1:1:5:0"] {
        assert_eq!(Batch::parse(bad), None, "{bad}");
    }
}

#[test]
fn admissions_in_the_last_minute_come_from_recent_steps() {
    let h = history(&["0:4:1000:4", "4:10:61000:5", "10:12:70000:2"], &[]);
    assert_eq!(h.admitted_since(10_000), 7);
    assert_eq!(h.last_to(), 12);
}

#[test]
fn eta_and_poll_pacing_follow_the_rate() {
    let open = Settings { admit_per_minute: 600, ..Settings::DEFAULT };
    assert_eq!(eta_seconds(&open, 1, 600.0), Some(1));
    assert_eq!(eta_seconds(&open, 600, 600.0), Some(60));
    assert_eq!(eta_seconds(&open, 600, 60.0), Some(600));
    assert_eq!(eta_seconds(&open, 5, 0.0), None, "nobody goes in: nothing to promise");
    assert_eq!(eta_seconds(&Settings { state: QueueState::Paused, ..open.clone() }, 5, 600.0), None);
    assert_eq!(poll_after_ms(&open, Some(1), 1.0), 1000);
    assert_eq!(poll_after_ms(&open, Some(3600), 1.0), 10_000);
    assert_eq!(poll_after_ms(&open, Some(3600), 5.0), 12_000, "jitter is clamped to +20%");
    let short_grace = Settings { abandon_after_seconds: 8, ..open };
    assert_eq!(poll_after_ms(&short_grace, Some(3600), 1.0), 2000, "a quarter of the grace");
}

#[test]
fn settings_changes_are_range_checked() {
    assert_eq!(SettingsPatch::default().validate(), Err(PatchError::Empty));
    let zero_rate = SettingsPatch { admit_per_minute: Some(0), ..Default::default() };
    assert!(matches!(zero_rate.validate(), Err(PatchError::OutOfRange { field: "admit_per_minute", .. })));
    let sold = SettingsPatch { state: Some(QueueState::SoldOut), ..Default::default() };
    assert_eq!(sold.validate(), Err(PatchError::SoldOutIsNotSettable));
    let ok = SettingsPatch { state: Some(QueueState::Paused), max_active: Some(100), ..Default::default() };
    assert_eq!(ok.validate(), Ok(()));
}

#[test]
fn settings_read_from_redis_need_every_field() {
    let mut hash: HashMap<String, String> = [
        ("state", "open"),
        ("admit_per_minute", "60"),
        ("max_active", "10"),
        ("session_seconds", "600"),
        ("abandon_after_seconds", "30"),
        ("opens_at", "0"),
        ("version", "3"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let s = Settings::from_hash(&hash).expect("settings");
    assert_eq!((s.state, s.admit_per_minute, s.opens_at_ms, s.version), (QueueState::Open, 60, None, 3));
    hash.remove("max_active");
    assert_eq!(Settings::from_hash(&hash), None);
}

#[test]
fn while_the_last_seats_sell_fans_poll_at_least_every_five_seconds() {
    let open = Settings { abandon_after_seconds: 600, ..Settings::DEFAULT };
    assert_eq!(poll_after_ms(&open, Some(3600), 1.0), 10_000);
    let held = Settings { all_held: Some(HeldBack::default()), ..open.clone() };
    assert_eq!(poll_after_ms(&held, None, 1.0), ENDING_POLL_MS);
    assert!(poll_after_ms(&held, Some(3600), 1.2) <= 6000);
    let ending = Settings { ending: true, ..open };
    assert_eq!(poll_after_ms(&ending, Some(3600), 1.0), ENDING_POLL_MS);
}

#[test]
fn the_rate_in_force_is_the_operators_or_the_adaptive_decision_within_its_bounds() {
    let fixed = Settings { admit_per_minute: 600, rate_in_force: Some(90), ..Settings::DEFAULT };
    assert_eq!(fixed.rate(), 600, "a fixed room ignores a decision left from adaptive");
    let adaptive = Settings { rate_mode: RateMode::Adaptive, rate_floor: 100, rate_ceiling: 300, ..fixed.clone() };
    assert_eq!(adaptive.rate(), 90, "the decision in force");
    let undecided = Settings { rate_in_force: None, ..adaptive.clone() };
    assert_eq!(undecided.rate(), 300, "before the first decision: the operators' rate within the bounds");
    let low = Settings { admit_per_minute: 10, ..undecided };
    assert_eq!(low.rate(), 100);
}

#[test]
fn settings_written_to_redis_read_back_the_same() {
    let s = Settings {
        rate_mode: RateMode::Adaptive,
        rate_floor: 120,
        rate_ceiling: 2400,
        target_p99_ms: 250,
        target_503_percent: 2,
        all_held: Some(HeldBack { seats: 7, next_release_ms: Some(1_800_000_000_000) }),
        ..Settings::DEFAULT
    };
    let hash: HashMap<String, String> = s.fields().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    assert_eq!(Settings::from_hash(&hash), Some(s));
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn any_settings_body_is_read_and_checked_without_panicking(body in testkit::settings_bodies()) {
            let Ok(patch) = serde_json::from_value::<SettingsPatch>(body.clone()) else { return Ok(()) };
            match patch.validate() {
                Ok(()) => {
                    // What passes is in range, field by field.
                    let within = |v: Option<u32>, min: u32, max: u32| v.is_none_or(|v| (min..=max).contains(&v));
                    prop_assert!(within(patch.admit_per_minute, 1, 1_000_000), "{}", body);
                    prop_assert!(within(patch.max_active, 1, 10_000_000), "{}", body);
                    prop_assert!(within(patch.session_seconds, 10, 86_400), "{}", body);
                    prop_assert!(within(patch.abandon_after_seconds, 5, 86_400), "{}", body);
                    prop_assert!(patch.opens_at.is_none_or(|at| at <= 4_102_444_800), "{}", body);
                    prop_assert!(within(patch.rate_floor, 1, 1_000_000), "{}", body);
                    prop_assert!(within(patch.rate_ceiling, 1, 1_000_000), "{}", body);
                    prop_assert!(within(patch.target_p99_ms, 10, 600_000), "{}", body);
                    prop_assert!(within(patch.target_503_percent, 0, 100), "{}", body);
                    if let (Some(floor), Some(ceiling)) = (patch.rate_floor, patch.rate_ceiling) {
                        prop_assert!(floor <= ceiling, "{}", body);
                    }
                    prop_assert!(patch != SettingsPatch::default() && patch.state != Some(QueueState::SoldOut));
                }
                Err(e) => prop_assert!(["setting_out_of_range", "state_not_settable", "empty_change"].contains(&e.code())),
            }
        }
    }
}

#[test]
fn a_room_is_quiet_only_with_nothing_for_a_step_to_do() {
    let rooms = Rooms::default();
    let put = |state, seq, head| {
        rooms.put(
            1,
            Room {
                live: live(state, seq, head),
                history: Default::default(),
                left: Default::default(),
                etas: Default::default(),
            },
        )
    };
    assert!(!rooms.quiet(1), "a room never read is stepped");
    put(QueueState::Open, 10, 10);
    assert!(rooms.quiet(1), "everyone who joined was let in");
    rooms.seen(1, "fan-1");
    assert!(!rooms.quiet(1), "a poll to count");
    rooms.take_seen(1);
    assert!(rooms.quiet(1));
    rooms.gave(1, 11);
    assert!(!rooms.quiet(1), "a place given out here since the view was read");
    put(QueueState::Open, 11, 10);
    assert!(!rooms.quiet(1), "a fan waiting");
    put(QueueState::Open, 11, 11);
    assert!(rooms.quiet(1));
    put(QueueState::Prequeue, 11, 11);
    assert!(!rooms.quiet(1), "a pre-queue whose opening time a step checks");
}

#[test]
fn challenge_settings_are_checked_and_a_room_without_them_has_none() {
    let patch = |p: SettingsPatch| p.validate().map_err(|e| e.code());
    let crossed = SettingsPatch {
        challenge_min_difficulty: Some(5000),
        challenge_max_difficulty: Some(4000),
        ..Default::default()
    };
    assert_eq!(patch(crossed), Err("setting_out_of_range"));
    assert_eq!(
        patch(SettingsPatch { challenge_difficulty: Some(999), ..Default::default() }),
        Err("setting_out_of_range")
    );
    assert_eq!(
        patch(SettingsPatch { challenge_window_seconds: Some(0), ..Default::default() }),
        Err("setting_out_of_range")
    );
    let auto =
        SettingsPatch { challenge: Some(ChallengeMode::Auto), challenge_difficulty: Some(1000), ..Default::default() };
    assert_eq!(patch(auto), Ok(()));
    // A room written before the gate existed reads as one without a challenge.
    let old: HashMap<String, String> =
        Settings::DEFAULT.fields()[..8].iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let read = Settings::from_hash(&old).expect("an older room's settings");
    assert_eq!(
        (read.challenge, read.challenge_difficulty),
        (ChallengeMode::Off, Settings::DEFAULT.challenge_difficulty)
    );
    // Every field written is read back.
    let full: HashMap<String, String> =
        Settings::DEFAULT.fields().iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    assert_eq!(Settings::from_hash(&full), Some(Settings::DEFAULT));
}

#[test]
fn fans_behind_the_code_holders_count_every_holder_waiting_ahead() {
    let mut live = live(QueueState::Open, 20, 15);
    live.counts.later_seq = 9;
    live.counts.later_head = 4;
    // Five holders wait (16..=20); the line behind them has moved past its first four numbers.
    assert_eq!(live.later_position(5), Some(6));
    assert_eq!(live.later_position(9), Some(10));
    assert_eq!(live.later_position(4), None, "moved into the queue, or skipped: its place is looked up");
    assert_eq!(live.waiting(), 10);
    assert_eq!(live.later_waiting(), 5);
}

#[test]
fn a_room_without_access_reads_as_public_and_a_damaged_one_is_refused() {
    let mut hash: HashMap<String, String> =
        Settings::DEFAULT.fields().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    assert_eq!(Settings::from_hash(&hash).map(|s| s.access), Some(Access::Public));
    hash.insert("access".into(), "codes_first".into());
    assert_eq!(Settings::from_hash(&hash).map(|s| s.access), Some(Access::CodesFirst));
    hash.remove("access");
    assert_eq!(Settings::from_hash(&hash).map(|s| s.access), Some(Access::Public));
    hash.insert("access".into(), "everyone".into());
    assert_eq!(Settings::from_hash(&hash), None);
}

#[test]
fn a_full_room_promises_the_slots_that_free_not_the_rate() {
    let mut live = live(QueueState::Open, 100, 10);
    live.settings.admit_per_minute = 600;
    live.settings.max_active = 50;
    live.settings.session_seconds = 100;
    live.counts.active = 20;
    assert_eq!(live.eta_seconds(30), Some(3), "room inside: the rate");
    // Full: 30 admitted at 0 s and 20 at 10 s (sessions end at 100 s and 110 s); nothing lately.
    live.counts.active = 50;
    let h = history(&["0:30:1000000:30", "30:50:1010000:20"], &[]);
    live.outflow = h.outflow(1_040_000, 100_000);
    live.redis_ms = 1_040_000;
    live.read_at = Instant::now();
    assert_eq!(live.outflow.recent_per_minute, 0.0);
    assert_eq!(live.outflow.sessions_end, vec![(1_100_000, 30), (1_110_000, 50)]);
    assert_eq!(live.eta_seconds(30), Some(60), "the 30th slot frees when the first sessions end");
    assert_eq!(live.eta_seconds(31), Some(70));
    assert_eq!(live.eta_seconds(51), None, "beyond every session inside, and nothing freed lately");
    // Slots freed lately (paid orders, leavers): 10 in the last 15 s, 40 a minute.
    live.outflow.recent_per_minute = 40.0;
    assert_eq!(live.eta_seconds(30), Some(45), "sooner than the sessions, at the pace slots free");
    assert_eq!(live.eta_seconds(51), Some(77));
}

#[test]
fn the_eta_error_is_absolute_and_relative_and_each_fan_counts_once_per_node() {
    assert_eq!(EtaError::of(&[]), None);
    let samples: Vec<EtaSample> = [5.0, 10.0, 20.0, 30.0].iter().map(|&w| EtaSample::new(10, w)).collect();
    let e = EtaError::of(&samples).expect("four fans");
    assert_eq!((e.fans, e.abs_p50_seconds, e.abs_p90_seconds), (4, 5.0, 20.0));
    assert_eq!((e.rel_p50, e.rel_p90), (0.5, 1.0));
    // A wait under a second has no relative error; both survive Redis's text.
    let quick = EtaSample::new(2, 0.5);
    assert_eq!((quick.abs, quick.rel), (1.5, None));
    for s in [quick, samples[2]] {
        assert_eq!(EtaSample::parse(&s.encode()), Some(s));
    }
    assert_eq!(EtaSample::parse("1.5"), None);
    let mut log = EtaLog::default();
    assert!(log.first("a") && !log.first("a") && log.first("b"));
}
