//! A waiting room as one gateway node sees it: the settings and queue figures it refreshes from Redis a few
//! times a second, and the pure decisions made from them (a fan's standing, ETA, poll pacing). No I/O here:
//! status polls are answered from this node-local view, so they never touch Redis one by one.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub mod shuffle;

/// The state of an event's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum QueueState {
    /// Before the opening: joiners wait unordered; their places are drawn at random when it opens.
    Prequeue,
    /// Admitting in queue order at the configured rate.
    Open,
    /// Nobody is admitted; places are kept.
    Paused,
    /// Nobody joins or is admitted.
    Closed,
    /// Booking reported every seat sold: nobody joins or is admitted, and waiting fans are told.
    SoldOut,
}

impl QueueState {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueState::Prequeue => "prequeue",
            QueueState::Open => "open",
            QueueState::Paused => "paused",
            QueueState::Closed => "closed",
            QueueState::SoldOut => "sold_out",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Some(match raw {
            "prequeue" => QueueState::Prequeue,
            "open" => QueueState::Open,
            "paused" => QueueState::Paused,
            "closed" => QueueState::Closed,
            "sold_out" => QueueState::SoldOut,
            _ => return None,
        })
    }
}

impl fmt::Display for QueueState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a join must be paid for with a solved proof-of-work challenge (`crate::gate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum ChallengeMode {
    /// A join needs an account token only.
    Off,
    /// A join that gives a new place carries a solved challenge, single use, bound to the room and the account.
    On,
    /// As `on`, with the difficulty following the surge, within the room's bounds (`lua/queue_tune_challenge.lua`).
    Auto,
}

impl ChallengeMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ChallengeMode::Off => "off",
            ChallengeMode::On => "on",
            ChallengeMode::Auto => "auto",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "off" => Some(ChallengeMode::Off),
            "on" => Some(ChallengeMode::On),
            "auto" => Some(ChallengeMode::Auto),
            _ => None,
        }
    }
}

/// Who may join a room, and in which order (presale codes: `POST /admin/events/{id}/codes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Access {
    /// Anyone with an account joins; a code is not asked for, and one sent is not redeemed.
    Public,
    /// Only a fan who redeems a presale code (or redeemed one in this room before) joins.
    CodeRequired,
    /// Everyone joins; code holders are admitted ahead of every fan who joined without one, in their own FIFO.
    CodesFirst,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Public => "public",
            Access::CodeRequired => "code_required",
            Access::CodesFirst => "codes_first",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "public" => Some(Access::Public),
            "code_required" => Some(Access::CodeRequired),
            "codes_first" => Some(Access::CodesFirst),
            _ => None,
        }
    }
}

/// How a room lets fans in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Queueing {
    /// In queue order, at the room's rate, while fewer than `max_active` are inside.
    Fifo,
    /// At once while fewer than `max_active` are inside, whatever the rate; then in queue order as slots free.
    Passthrough,
    /// At once while there is room and nobody waits; otherwise a new fan is turned away (409 `no_places`).
    /// Fans who hold a place keep it.
    Reject,
    /// A fan who joins enters a pool; every `draw_every_seconds` everyone in it gets a random place behind the
    /// places given before, from a recorded, recomputable draw; then in queue order at the rate.
    Lottery,
}

impl Queueing {
    pub fn as_str(self) -> &'static str {
        match self {
            Queueing::Fifo => "fifo",
            Queueing::Passthrough => "passthrough",
            Queueing::Reject => "reject",
            Queueing::Lottery => "lottery",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "fifo" => Some(Queueing::Fifo),
            "passthrough" => Some(Queueing::Passthrough),
            "reject" => Some(Queueing::Reject),
            "lottery" => Some(Queueing::Lottery),
            _ => None,
        }
    }
}

/// How a room's admission rate is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum RateMode {
    /// `admit_per_minute`, as operators set it.
    Fixed,
    /// Between `rate_floor` and `rate_ceiling`, following how booking answers (`lua/queue_adapt.lua`): halved
    /// when its answers miss the room's targets, raised by a tenth of the range a second while they meet them.
    Adaptive,
}

impl RateMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RateMode::Fixed => "fixed",
            RateMode::Adaptive => "adaptive",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "fixed" => Some(RateMode::Fixed),
            "adaptive" => Some(RateMode::Adaptive),
            _ => None,
        }
    }
}

/// A time on the command line: Unix seconds, or `+N` for N seconds from now.
pub fn unix_time_arg(raw: &str) -> Result<u64, String> {
    match raw.strip_prefix('+') {
        Some(offset) => {
            offset.parse::<u64>().map(|n| tokens::unix_now() + n).map_err(|_| format!("+N: N seconds, not {offset:?}"))
        }
        None => raw.parse().map_err(|_| format!("Unix seconds or +N, not {raw:?}")),
    }
}

/// Seats that are held or awaiting payment while none is free: they may come back when a hold or a payment
/// window ends unused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HeldBack {
    /// Seats held, or in orders awaiting payment.
    pub seats: u64,
    /// When the earliest of those holds or payment windows ends, Unix milliseconds.
    pub next_release_ms: Option<u64>,
}

/// Bounds of a challenge's difficulty: the most hashes one can take (a solver needs half of it on average).
pub const DIFFICULTY_RANGE: (u32, u32) = (1_000, 100_000_000);

/// An event's waiting-room settings, as operators set them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Settings {
    pub state: QueueState,
    /// Fans admitted per minute while open.
    pub admit_per_minute: u32,
    /// Most fans admitted within one session window.
    pub max_active: u32,
    /// How long an admission lasts (the admission proof's lifetime), in seconds.
    pub session_seconds: u32,
    /// A waiting fan not seen (join or poll) for this long is skipped when its turn comes, in seconds.
    pub abandon_after_seconds: u32,
    /// When the pre-queue opens by itself, Unix milliseconds; `None` waits for an operator.
    pub opens_at_ms: Option<u64>,
    /// Bumped on every change.
    pub version: u64,
    /// Every seat left is held or awaiting payment (set by the gateway from booking's availability, like
    /// `sold_out`): nobody is admitted until some come back. What may come back, and from when.
    pub all_held: Option<HeldBack>,
    /// The last seats are selling (set by the gateway, like `all_held`): the sale may end any moment, so fans
    /// poll more often.
    pub ending: bool,
    /// Whether a new place costs a solved challenge.
    pub challenge: ChallengeMode,
    /// The most hashes a challenge can take to solve (uniform: half of it on average). With `auto`, the
    /// difficulty in force, which the tuning step moves.
    pub challenge_difficulty: u32,
    /// `auto`'s bounds on the difficulty.
    pub challenge_min_difficulty: u32,
    pub challenge_max_difficulty: u32,
    /// `auto` decides once per window: more joins in it than the room admits in that time, and the difficulty
    /// doubles; fewer than half, and it halves. In seconds.
    pub challenge_window_seconds: u32,
    /// A client that sends a forged or spent solution is answered as a waiting fan whose place never comes,
    /// rather than refused (it learns nothing to adapt to).
    pub infinite_queue_for_failed: bool,
    /// Most places one client network (address prefix: `GATEWAY_NETWORK_PREFIX_V4` / `_V6`) is given in the
    /// room; 0: no cap. Generous: a venue's or a campus's fans share one address.
    pub places_per_network: u32,
    /// Who may join, and whether code holders go first.
    pub access: Access,
    /// How fans are let in.
    pub queueing: Queueing,
    /// Admission stopped while the room stays open: fans join and keep their places, nobody is let in.
    pub queue_all: bool,
    /// `lottery`: seconds between draws.
    pub draw_every_seconds: u32,
    /// Whether the rate is the operators' or follows booking.
    pub rate_mode: RateMode,
    /// `adaptive`'s bounds on the rate, fans per minute.
    pub rate_floor: u32,
    pub rate_ceiling: u32,
    /// `adaptive`'s targets: booking's 99th percentile answer time, in ms, and its share of 503s, in percent.
    pub target_p99_ms: u32,
    pub target_503_percent: u32,
    /// `adaptive`: the rate in force and why, as the last decision left them (`None` before the first).
    pub rate_in_force: Option<u32>,
    pub rate_reason: Option<String>,
}

impl Settings {
    /// Defaults of a newly configured room.
    pub const DEFAULT: Settings = Settings {
        state: QueueState::Open,
        admit_per_minute: 600,
        max_active: 2000,
        session_seconds: 900,
        abandon_after_seconds: 60,
        opens_at_ms: None,
        version: 0,
        all_held: None,
        ending: false,
        challenge: ChallengeMode::Off,
        challenge_difficulty: 40_000,
        challenge_min_difficulty: 40_000,
        challenge_max_difficulty: 640_000,
        challenge_window_seconds: 10,
        infinite_queue_for_failed: false,
        places_per_network: 1000,
        access: Access::Public,
        queueing: Queueing::Fifo,
        queue_all: false,
        draw_every_seconds: 60,
        rate_mode: RateMode::Fixed,
        rate_floor: 60,
        rate_ceiling: 6000,
        target_p99_ms: 1000,
        target_503_percent: 1,
        rate_in_force: None,
        rate_reason: None,
    };

    /// Fans admitted per minute now: the operators' rate, or in `adaptive` the rate in force (until the first
    /// decision, the operators' rate within the bounds).
    pub fn rate(&self) -> u32 {
        match self.rate_mode {
            RateMode::Fixed => self.admit_per_minute,
            RateMode::Adaptive => self.rate_in_force.unwrap_or_else(|| {
                self.admit_per_minute.clamp(self.rate_floor.min(self.rate_ceiling), self.rate_ceiling)
            }),
        }
    }

    /// How fast fans go in while there is room, for ETAs: the rate, or without bound in a room whose queueing
    /// lets fans in as fast as slots allow.
    pub fn pace_per_minute(&self) -> f64 {
        match self.queueing {
            Queueing::Fifo | Queueing::Lottery => f64::from(self.rate()),
            Queueing::Passthrough | Queueing::Reject => f64::INFINITY,
        }
    }

    /// The Redis hash's fields, as [`Self::from_hash`] reads them.
    pub fn fields(&self) -> [(&'static str, String); 27] {
        let held = self.all_held.unwrap_or_default();
        [
            ("state", self.state.as_str().to_owned()),
            ("admit_per_minute", self.admit_per_minute.to_string()),
            ("max_active", self.max_active.to_string()),
            ("session_seconds", self.session_seconds.to_string()),
            ("abandon_after_seconds", self.abandon_after_seconds.to_string()),
            ("opens_at", self.opens_at_ms.unwrap_or(0).to_string()),
            ("version", self.version.to_string()),
            ("all_held", u8::from(self.all_held.is_some()).to_string()),
            ("held_seats", held.seats.to_string()),
            ("held_next_release", held.next_release_ms.unwrap_or(0).to_string()),
            ("ending", u8::from(self.ending).to_string()),
            ("challenge", self.challenge.as_str().to_owned()),
            ("challenge_difficulty", self.challenge_difficulty.to_string()),
            ("challenge_min_difficulty", self.challenge_min_difficulty.to_string()),
            ("challenge_max_difficulty", self.challenge_max_difficulty.to_string()),
            ("challenge_window_seconds", self.challenge_window_seconds.to_string()),
            ("infinite_queue_for_failed", u8::from(self.infinite_queue_for_failed).to_string()),
            ("places_per_network", self.places_per_network.to_string()),
            ("access", self.access.as_str().to_owned()),
            ("queueing", self.queueing.as_str().to_owned()),
            ("queue_all", u8::from(self.queue_all).to_string()),
            ("draw_every_seconds", self.draw_every_seconds.to_string()),
            ("rate_mode", self.rate_mode.as_str().to_owned()),
            ("rate_floor", self.rate_floor.to_string()),
            ("rate_ceiling", self.rate_ceiling.to_string()),
            ("target_p99_ms", self.target_p99_ms.to_string()),
            ("target_503_percent", self.target_503_percent.to_string()),
        ]
    }

    /// Reads the Redis hash; `None` when the room is not configured or the hash is damaged.
    pub fn from_hash(hash: &HashMap<String, String>) -> Option<Settings> {
        let num = |name: &str| hash.get(name).and_then(|v| v.parse::<u64>().ok());
        let small = |name: &str| num(name).and_then(|v| u32::try_from(v).ok());
        Some(Settings {
            state: QueueState::parse(hash.get("state")?)?,
            admit_per_minute: small("admit_per_minute")?,
            max_active: small("max_active")?,
            session_seconds: small("session_seconds")?,
            abandon_after_seconds: small("abandon_after_seconds")?,
            opens_at_ms: num("opens_at").filter(|&ms| ms > 0),
            version: num("version").unwrap_or(0),
            all_held: (num("all_held") == Some(1)).then(|| HeldBack {
                seats: num("held_seats").unwrap_or(0),
                next_release_ms: num("held_next_release").filter(|&ms| ms > 0),
            }),
            ending: num("ending") == Some(1),
            // A room made before the gate existed has none of its fields: it has no challenge.
            challenge: hash.get("challenge").map_or(Some(ChallengeMode::Off), |c| ChallengeMode::parse(c))?,
            challenge_difficulty: small("challenge_difficulty").unwrap_or(Settings::DEFAULT.challenge_difficulty),
            challenge_min_difficulty: small("challenge_min_difficulty")
                .unwrap_or(Settings::DEFAULT.challenge_min_difficulty),
            challenge_max_difficulty: small("challenge_max_difficulty")
                .unwrap_or(Settings::DEFAULT.challenge_max_difficulty),
            challenge_window_seconds: small("challenge_window_seconds")
                .unwrap_or(Settings::DEFAULT.challenge_window_seconds),
            infinite_queue_for_failed: num("infinite_queue_for_failed") == Some(1),
            places_per_network: small("places_per_network").unwrap_or(Settings::DEFAULT.places_per_network),
            access: hash.get("access").map_or(Some(Access::Public), |a| Access::parse(a))?,
            queueing: hash.get("queueing").map_or(Some(Queueing::Fifo), |q| Queueing::parse(q))?,
            queue_all: num("queue_all") == Some(1),
            draw_every_seconds: small("draw_every_seconds").unwrap_or(Settings::DEFAULT.draw_every_seconds),
            rate_mode: hash.get("rate_mode").map_or(Some(RateMode::Fixed), |m| RateMode::parse(m))?,
            rate_floor: small("rate_floor").unwrap_or(Settings::DEFAULT.rate_floor),
            rate_ceiling: small("rate_ceiling").unwrap_or(Settings::DEFAULT.rate_ceiling),
            target_p99_ms: small("target_p99_ms").unwrap_or(Settings::DEFAULT.target_p99_ms),
            target_503_percent: small("target_503_percent").unwrap_or(Settings::DEFAULT.target_503_percent),
            rate_in_force: small("rate_in_force"),
            rate_reason: hash.get("rate_reason").cloned(),
        })
    }
}

/// A change operators ask for; absent fields stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct SettingsPatch {
    /// `prequeue`, `open`, `paused` or `closed` (`sold_out` is the gateway's to set).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub state: Option<QueueState>,
    /// Fans admitted per minute (the rate of `fixed`), 1 to 1,000,000.
    #[schema(minimum = 1, maximum = 1_000_000)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub admit_per_minute: Option<u32>,
    /// Most fans admitted within one session window, 1 to 10,000,000.
    #[schema(minimum = 1, maximum = 10_000_000)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub max_active: Option<u32>,
    /// How long an admission lasts, 10 to 86,400 seconds.
    #[schema(minimum = 10, maximum = 86_400)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub session_seconds: Option<u32>,
    /// A waiting fan not seen for this long is skipped when its turn comes, 5 to 86,400 seconds.
    #[schema(minimum = 5, maximum = 86_400)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub abandon_after_seconds: Option<u32>,
    /// When the pre-queue opens: Unix seconds (`+N` on the command line: N seconds from now); 0 clears it.
    #[schema(maximum = 4_102_444_800_u64)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long, value_parser = unix_time_arg)]
    pub opens_at: Option<u64>,
    /// `on`: a new place costs a solved proof-of-work challenge; `auto`: the same, at a difficulty that
    /// follows the surge; `off`: an account token is enough.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub challenge: Option<ChallengeMode>,
    /// The most hashes a challenge can take, 1,000 to 100,000,000 (a solver needs half on average); with
    /// `auto`, where the difficulty starts from.
    #[schema(minimum = 1_000, maximum = 100_000_000)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub challenge_difficulty: Option<u32>,
    /// `auto`'s lowest difficulty, 1,000 to 100,000,000.
    #[schema(minimum = 1_000, maximum = 100_000_000)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub challenge_min_difficulty: Option<u32>,
    /// `auto`'s highest difficulty, 1,000 to 100,000,000.
    #[schema(minimum = 1_000, maximum = 100_000_000)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub challenge_max_difficulty: Option<u32>,
    /// How often `auto` decides, 1 to 3,600 seconds.
    #[schema(minimum = 1, maximum = 3600)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub challenge_window_seconds: Option<u32>,
    /// Answer forged or spent solutions as a waiting fan that never advances, instead of refusing them.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub infinite_queue_for_failed: Option<bool>,
    /// Most places one client network (address prefix) is given in the room, 0 to 10,000,000; 0: no cap.
    #[schema(maximum = 10_000_000)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub places_per_network: Option<u32>,
    /// `public`, `code_required` (a presale: only code holders join) or `codes_first` (code holders are
    /// admitted ahead of everyone who joined without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub access: Option<Access>,
    /// `fifo` (in queue order at the rate), `passthrough` (at once up to `max_active`, then in order),
    /// `reject` (at once while there is room; otherwise new fans are turned away) or `lottery` (joiners wait in
    /// a pool that a recorded draw places at random every `draw_every_seconds`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub queueing: Option<Queueing>,
    /// `true`: nobody is let in while the room stays open (fans join and keep their places); `false` resumes.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub queue_all: Option<bool>,
    /// `lottery`'s seconds between draws, 5 to 3,600.
    #[schema(minimum = 5, maximum = 3600)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub draw_every_seconds: Option<u32>,
    /// `fixed` (`admit_per_minute`) or `adaptive` (between the floor and the ceiling, following booking's
    /// answers against the targets below).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub rate_mode: Option<RateMode>,
    /// `adaptive`'s lowest rate, 1 to 1,000,000 fans per minute.
    #[schema(minimum = 1, maximum = 1_000_000)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub rate_floor: Option<u32>,
    /// `adaptive`'s highest rate, 1 to 1,000,000 fans per minute.
    #[schema(minimum = 1, maximum = 1_000_000)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub rate_ceiling: Option<u32>,
    /// `adaptive`'s target for booking's 99th percentile answer time, 10 to 600,000 ms.
    #[schema(minimum = 10, maximum = 600_000)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub target_p99_ms: Option<u32>,
    /// `adaptive`'s target for booking's share of 503 answers, 0 to 100 percent.
    #[schema(maximum = 100)]
    #[serde(skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub target_503_percent: Option<u32>,
}

/// Most changes one room's schedule holds waiting.
pub const SCHEDULE_MAX: usize = 100;

/// A change of a room's settings at a time of its own (the room's schedule).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Scheduled {
    /// Names the change, to cancel it.
    pub id: String,
    /// When it applies, Unix seconds (on every node within a second of it).
    pub at: u64,
    /// The change, as `PUT /admin/events/{id}` takes it.
    pub set: SettingsPatch,
}

/// A scheduled change once applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Applied {
    #[serde(flatten)]
    pub change: Scheduled,
    /// When it was applied, Unix seconds.
    pub applied_at: u64,
    /// `applied`, or why it was not (`state_change_refused`: back to prequeue after places were given).
    pub outcome: String,
}

/// Why a settings change was refused (a 422 with this code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    #[error("{field} must be between {min} and {max}")]
    OutOfRange { field: &'static str, min: u64, max: u64 },
    #[error("sold_out is set by the gateway when booking reports it, not by operators")]
    SoldOutIsNotSettable,
    #[error("the change is empty")]
    Empty,
    #[error("challenge_min_difficulty is above challenge_max_difficulty")]
    BoundsCrossed,
    #[error("rate_floor is above rate_ceiling")]
    RateBoundsCrossed,
}

impl PatchError {
    pub fn code(&self) -> &'static str {
        match self {
            PatchError::OutOfRange { .. } => "setting_out_of_range",
            PatchError::SoldOutIsNotSettable => "state_not_settable",
            PatchError::Empty => "empty_change",
            PatchError::BoundsCrossed | PatchError::RateBoundsCrossed => "setting_out_of_range",
        }
    }
}

impl SettingsPatch {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), PatchError> {
        if *self == SettingsPatch::default() {
            return Err(PatchError::Empty);
        }
        if self.state == Some(QueueState::SoldOut) {
            return Err(PatchError::SoldOutIsNotSettable);
        }
        let (easiest, hardest) = DIFFICULTY_RANGE;
        let ranges: [(&'static str, Option<u32>, u64, u64); 14] = [
            ("admit_per_minute", self.admit_per_minute, 1, 1_000_000),
            ("max_active", self.max_active, 1, 10_000_000),
            ("session_seconds", self.session_seconds, 10, 86_400),
            ("abandon_after_seconds", self.abandon_after_seconds, 5, 86_400),
            ("challenge_difficulty", self.challenge_difficulty, easiest.into(), hardest.into()),
            ("challenge_min_difficulty", self.challenge_min_difficulty, easiest.into(), hardest.into()),
            ("challenge_max_difficulty", self.challenge_max_difficulty, easiest.into(), hardest.into()),
            ("challenge_window_seconds", self.challenge_window_seconds, 1, 3600),
            ("places_per_network", self.places_per_network, 0, 10_000_000),
            ("rate_floor", self.rate_floor, 1, 1_000_000),
            ("rate_ceiling", self.rate_ceiling, 1, 1_000_000),
            ("target_p99_ms", self.target_p99_ms, 10, 600_000),
            ("target_503_percent", self.target_503_percent, 0, 100),
            ("draw_every_seconds", self.draw_every_seconds, 5, 3600),
        ];
        for (field, value, min, max) in ranges {
            if let Some(v) = value
                && !(min..=max).contains(&u64::from(v))
            {
                return Err(PatchError::OutOfRange { field, min, max });
            }
        }
        if let (Some(lowest), Some(highest)) = (self.challenge_min_difficulty, self.challenge_max_difficulty)
            && lowest > highest
        {
            return Err(PatchError::BoundsCrossed);
        }
        if let (Some(lowest), Some(highest)) = (self.rate_floor, self.rate_ceiling)
            && lowest > highest
        {
            return Err(PatchError::RateBoundsCrossed);
        }
        if let Some(at) = self.opens_at
            && at > 4_102_444_800
        {
            return Err(PatchError::OutOfRange { field: "opens_at", min: 0, max: 4_102_444_800 });
        }
        Ok(())
    }
}

/// One admission step that moved the head: places `from + 1 ..= to`, `admitted` of them admitted at `at_ms`
/// (the others were skipped as abandoned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub from: u64,
    pub to: u64,
    pub at_ms: u64,
    pub admitted: u64,
}

impl Batch {
    /// Parses the Redis member `from:to:at_ms:admitted`.
    pub fn parse(member: &str) -> Option<Batch> {
        let mut parts = member.split(':').map(|p| p.parse::<u64>().ok());
        let batch = Batch { from: parts.next()??, to: parts.next()??, at_ms: parts.next()??, admitted: parts.next()?? };
        (parts.next().is_none() && batch.from < batch.to).then_some(batch)
    }
}

/// A queue's counters, as one atomic read of Redis gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// The last place given out.
    pub seq: u64,
    /// The last place the admission step has passed.
    pub head: u64,
    /// Fans admitted within the session window (as of the last step).
    pub active: u64,
    pub admitted_total: u64,
    pub abandoned_total: u64,
    /// Fans in the pre-queue.
    pub prequeue: u64,
    /// The last number given in the line of fans who joined without a code while code holders go first.
    pub later_seq: u64,
    /// The last number of that line the admission step has moved into the queue (or skipped as abandoned).
    pub later_head: u64,
    /// Slots freed before their session ended: orders paid, fans who left.
    pub freed_total: u64,
    /// A lottery's last draw and the next, Redis's clock (ms; 0: none).
    pub last_draw_ms: u64,
    pub next_draw_ms: u64,
    /// Admitted fans counted in the room's ETA error, by every node.
    pub eta_counted: u64,
}

/// The queue figures of one refresh, replaced whole each time.
#[derive(Debug, Clone)]
pub struct Live {
    pub settings: Settings,
    pub counts: Counts,
    /// Median wait from join to admission over the last 1000 admitted fans.
    pub median_wait_ms: Option<u64>,
    /// Fans admitted over the last minute, from the step history.
    pub admitted_last_minute: u64,
    /// What a full room's ETAs are made of (see [`Live::eta_seconds`]).
    pub outflow: Outflow,
    /// The room's scheduled changes still to apply, earliest first.
    pub schedule: Vec<Scheduled>,
    /// How right the waits promised at joins were, over the room's last admitted fans (every node's).
    pub eta_error: Option<EtaError>,
    /// Redis's clock at the refresh, Unix ms.
    pub redis_ms: u64,
    /// When this node read it.
    pub read_at: Instant,
}

impl Live {
    /// Fans waiting for their turn (including any who abandoned and are not skipped yet), code holders and
    /// those behind them.
    pub fn waiting(&self) -> u64 {
        self.counts.seq.saturating_sub(self.counts.head) + self.later_waiting()
    }

    /// Fans in the line behind the code holders.
    pub fn later_waiting(&self) -> u64 {
        self.counts.later_seq.saturating_sub(self.counts.later_head)
    }

    /// The position of number `later` in the line behind the code holders, while it waits there: every place
    /// in the queue comes first. `None` once the line has moved past it (it has a place, or was skipped).
    pub fn later_position(&self, later: u64) -> Option<u64> {
        (later > self.counts.later_head)
            .then(|| self.counts.seq.saturating_sub(self.counts.head) + (later - self.counts.later_head))
    }

    /// Seconds until the fan at `position` is admitted (`None` while nothing can be promised). While the room
    /// has room, the configured rate decides. While it is full (`max_active` fans inside), each admission waits
    /// for a slot: the `position`-th slot is free by the time the `position`-th oldest session ends, and sooner
    /// as fast as paid orders and leavers freed slots lately (the admissions of the last
    /// [`OUTFLOW_WINDOW_MS`]).
    pub fn eta_seconds(&self, position: u64) -> Option<u64> {
        let settings = &self.settings;
        let rate = settings.pace_per_minute();
        if self.counts.active < u64::from(settings.max_active) {
            return eta_seconds(settings, position, rate);
        }
        let now = self.now_ms();
        let by_sessions = (settings.state == QueueState::Open)
            .then(|| self.outflow.sessions_end.iter().find(|(_, admitted)| *admitted >= position))
            .flatten()
            .map(|(end, _)| end.saturating_sub(now).div_ceil(1000));
        let by_recent = eta_seconds(settings, position, self.outflow.recent_per_minute.min(rate));
        match (by_recent, by_sessions) {
            (Some(recent), Some(sessions)) => Some(recent.min(sessions)),
            (recent, sessions) => recent.or(sessions),
        }
    }

    /// Redis's clock now, estimated from the refresh.
    pub fn now_ms(&self) -> u64 {
        self.redis_ms + self.read_at.elapsed().as_millis() as u64
    }
}

/// The window the recent outflow is measured over: short, so that a full room whose slots stopped freeing
/// stops promising the pace of the burst that filled it.
pub const OUTFLOW_WINDOW_MS: u64 = 15_000;

/// A room's outflow, as its steps show it at a refresh.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outflow {
    /// Admissions per minute over the last [`OUTFLOW_WINDOW_MS`].
    pub recent_per_minute: f64,
    /// The steps whose admissions are still within their session, oldest first: when their sessions end (ms),
    /// and how many admissions end by then.
    pub sessions_end: Vec<(u64, u64)>,
}

/// What every step did, accumulated from the start: enough to tell any place's fate without asking Redis.
#[derive(Debug, Default)]
pub struct History {
    /// Steps by their `to`.
    pub batches: BTreeMap<u64, Batch>,
    /// Places skipped as abandoned.
    pub skipped: BTreeSet<u64>,
}

impl History {
    /// The highest `to` known (fetch strictly above it next time).
    pub fn last_to(&self) -> u64 {
        self.batches.last_key_value().map_or(0, |(to, _)| *to)
    }

    pub fn last_skipped(&self) -> u64 {
        self.skipped.last().copied().unwrap_or(0)
    }

    /// When `place` was admitted, if it was.
    pub fn admitted_at(&self, place: u64) -> Option<u64> {
        if self.skipped.contains(&place) {
            return None;
        }
        let (_, batch) = self.batches.range(place..).next()?;
        (batch.from < place).then_some(batch.at_ms)
    }

    /// The outflow at `now_ms` of a room whose sessions last `session_ms`.
    pub fn outflow(&self, now_ms: u64, session_ms: u64) -> Outflow {
        let recent = self.admitted_since(now_ms.saturating_sub(OUTFLOW_WINDOW_MS));
        let mut within: Vec<&Batch> = self
            .batches
            .values()
            .rev()
            .take_while(|b| b.at_ms + session_ms > now_ms)
            .filter(|b| b.admitted > 0)
            .collect();
        within.sort_by_key(|b| b.at_ms);
        let mut admitted = 0;
        let sessions_end = within
            .into_iter()
            .map(|b| {
                admitted += b.admitted;
                (b.at_ms + session_ms, admitted)
            })
            .collect();
        Outflow { recent_per_minute: recent as f64 * 60_000.0 / OUTFLOW_WINDOW_MS as f64, sessions_end }
    }

    /// Fans admitted in steps at or after `since_ms`.
    pub fn admitted_since(&self, since_ms: u64) -> u64 {
        self.batches.values().rev().take_while(|b| b.at_ms >= since_ms).map(|b| b.admitted).sum()
    }
}

/// Where a fan stands, from its ticket's place and the node-local view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// In the pre-queue, before the draw.
    Prequeue { count: u64, opens_at_ms: Option<u64> },
    /// A pre-queue ticket after the draw: its place must be looked up once.
    Drawn,
    /// Waiting: `position` 1 is next.
    Waiting { position: u64 },
    /// Admitted at `at_ms`; the session lasts until `until_ms`.
    Admitted { at_ms: u64, until_ms: u64 },
    /// Skipped as abandoned: join again for a new place.
    Lapsed,
    /// Admitted, but the session is over: join again for a new place.
    SessionEnded,
}

/// A fan's standing. `place` 0 is a pre-queue ticket.
pub fn standing(live: &Live, history: &History, place: u64, now_ms: u64) -> Standing {
    if place == 0 {
        return if live.settings.state == QueueState::Prequeue {
            Standing::Prequeue { count: live.counts.prequeue, opens_at_ms: live.settings.opens_at_ms }
        } else {
            Standing::Drawn
        };
    }
    if place > live.counts.head {
        return Standing::Waiting { position: place - live.counts.head };
    }
    if history.skipped.contains(&place) {
        return Standing::Lapsed;
    }
    match history.admitted_at(place) {
        Some(at_ms) => {
            let until_ms = at_ms + u64::from(live.settings.session_seconds) * 1000;
            if until_ms > now_ms { Standing::Admitted { at_ms, until_ms } } else { Standing::SessionEnded }
        }
        // Passed, neither skipped nor in any known step: the steps were trimmed or lost; the fan must rejoin.
        None => Standing::SessionEnded,
    }
}

/// Seconds until a fan at `position` is admitted when `per_minute` fans go in a minute (`None` while nobody is
/// admitted, or nothing can be promised).
pub fn eta_seconds(settings: &Settings, position: u64, per_minute: f64) -> Option<u64> {
    (settings.state == QueueState::Open && per_minute >= 1.0)
        .then(|| (position as f64 * 60.0 / per_minute).ceil() as u64)
}

/// The longest pause between polls while the last seats sell or every seat left is held (before jitter).
pub const ENDING_POLL_MS: u64 = 5000;

/// How long a fan should wait before polling again: a quarter of its ETA, between 1 and 10 s (5 s while the
/// last seats sell), never more than a
/// quarter of the abandonment grace (so a polling fan is never taken for gone), spread by `jitter` in
/// 0.8..1.2 so fans who joined together do not poll together.
pub fn poll_after_ms(settings: &Settings, eta_seconds: Option<u64>, jitter: f64) -> u64 {
    // While the last seats sell, or every seat left is held or awaiting payment, the sale may end at any moment:
    // fans poll often enough to be told within ten seconds of the last sale.
    let most = if settings.ending || settings.all_held.is_some() { ENDING_POLL_MS } else { 10_000 };
    let ceiling = (u64::from(settings.abandon_after_seconds) * 250).clamp(1000, most);
    let base = eta_seconds.map_or(5000, |eta| eta * 250).clamp(1000, ceiling);
    (base as f64 * jitter.clamp(0.8, 1.2)) as u64
}

/// The fans who left a room within the last session, as this node has read them: their admissions (issued
/// before they left) are over.
#[derive(Debug, Default)]
pub struct Left {
    /// Account -> when it left (Redis's clock, ms).
    pub at: HashMap<String, u64>,
    /// The latest time read (fetch from it next time).
    pub last_ms: u64,
}

impl Left {
    /// Adds what a refresh read, and forgets who left longer ago than a session (and a minute): every
    /// admission they held has expired by then.
    pub fn extend(&mut self, left: Vec<(String, u64)>, now_ms: u64, session_seconds: u32) {
        for (account, at) in left {
            self.last_ms = self.last_ms.max(at);
            let entry = self.at.entry(account).or_default();
            *entry = (*entry).max(at);
        }
        let horizon = now_ms.saturating_sub((u64::from(session_seconds) + 60) * 1000);
        self.at.retain(|_, at| *at >= horizon);
    }
}

/// The fans this node has counted in the room's ETA error (`lua/queue_eta.lua` counts each once across every
/// node; this spares a round trip for each poll a fan makes once admitted).
#[derive(Debug, Default)]
pub struct EtaLog {
    counted: HashSet<String>,
}

impl EtaLog {
    /// Whether `account` is new here (then it is remembered).
    pub fn first(&mut self, account: &str) -> bool {
        if self.counted.len() >= 100 * EtaSample::KEPT {
            self.counted.clear();
        }
        self.counted.insert(account.to_owned())
    }
}

/// How right one admitted fan's promised wait was.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EtaSample {
    /// Seconds between the wait promised at the join and the wait it had.
    pub abs: f64,
    /// That, relative to the wait it had (for fans who waited a second or more).
    pub rel: Option<f64>,
}

impl EtaSample {
    /// Each room keeps the samples of its last this many admitted fans (in Redis, for every node).
    pub const KEPT: usize = 1000;

    pub fn new(promised_seconds: u64, waited_seconds: f64) -> Self {
        let abs = (waited_seconds - promised_seconds as f64).abs();
        Self { abs, rel: (waited_seconds >= 1.0).then(|| abs / waited_seconds) }
    }

    /// As Redis keeps it: "abs rel", rel "-" when there is none.
    pub fn encode(&self) -> String {
        match self.rel {
            Some(rel) => format!("{:.3} {rel:.4}", self.abs),
            None => format!("{:.3} -", self.abs),
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        let (abs, rel) = text.split_once(' ')?;
        Some(Self { abs: abs.parse().ok()?, rel: if rel == "-" { None } else { Some(rel.parse().ok()?) } })
    }
}

/// p50 and p90 of the ETA error of a room's last admitted fans that were promised a wait.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EtaError {
    /// Admitted fans counted.
    pub fans: usize,
    pub abs_p50_seconds: f64,
    pub abs_p90_seconds: f64,
    /// Relative to the wait the fan had (fans who waited a second or more).
    pub rel_p50: f64,
    pub rel_p90: f64,
}

impl EtaError {
    /// The error's p50 and p90 (nearest rank); `None` without samples.
    pub fn of(samples: &[EtaSample]) -> Option<Self> {
        let nearest = |mut v: Vec<f64>, q: f64| {
            v.sort_by(f64::total_cmp);
            v.get(((v.len() as f64 * q).ceil() as usize).clamp(1, v.len().max(1)) - 1).copied().unwrap_or(0.0)
        };
        let abs: Vec<f64> = samples.iter().map(|e| e.abs).collect();
        let rel: Vec<f64> = samples.iter().filter_map(|e| e.rel).collect();
        (!abs.is_empty()).then(|| EtaError {
            fans: abs.len(),
            abs_p50_seconds: nearest(abs.clone(), 0.5),
            abs_p90_seconds: nearest(abs, 0.9),
            rel_p50: nearest(rel.clone(), 0.5),
            rel_p90: nearest(rel, 0.9),
        })
    }
}

/// An event's room on this node.
#[derive(Debug)]
pub struct Room {
    pub live: Live,
    pub history: Arc<RwLock<History>>,
    pub left: Arc<RwLock<Left>>,
    pub etas: Arc<Mutex<EtaLog>>,
}

impl Room {
    /// When `account` left the room, if it did within the last session.
    pub fn left_at(&self, account: &str) -> Option<u64> {
        let left = self.left.read().ok()?;
        if left.at.is_empty() { None } else { left.at.get(account).copied() }
    }
}

/// Every room this node knows, and the fans whose polls it served since the last flush to Redis.
#[derive(Debug, Default)]
pub struct Rooms {
    rooms: RwLock<HashMap<i64, Arc<Room>>>,
    /// When the list of rooms was last read from Redis.
    listed_at: RwLock<Option<Instant>>,
    seen: Mutex<HashMap<i64, HashSet<String>>>,
    /// The highest place this node knows was given out in each queue: in a view of the room it read, or by
    /// itself. It only grows, whatever Redis forgets.
    given: Mutex<HashMap<i64, u64>>,
}

impl Rooms {
    /// The highest place this node knows was given out in `event`'s queue, in any view of the room it read or
    /// by itself. A new place goes above it, however far behind Redis's counter may have fallen.
    pub fn floor(&self, event: i64) -> u64 {
        self.given.lock().ok().and_then(|g| g.get(&event).copied()).unwrap_or(0)
    }

    /// Notes a place given out (by this node, or as a view of the room says).
    pub fn gave(&self, event: i64, place: u64) {
        if let Ok(mut given) = self.given.lock() {
            let highest = given.entry(event).or_default();
            *highest = (*highest).max(place);
        }
    }

    pub fn get(&self, event: i64) -> Option<Arc<Room>> {
        self.rooms.read().ok()?.get(&event).cloned()
    }

    /// The room's session length as this node knows it, and when `account` left it if it did within the last
    /// session (read in place: the forwarding path asks on every request).
    pub fn session_and_left(&self, event: i64, account: &str) -> Option<(u32, Option<u64>)> {
        let rooms = self.rooms.read().ok()?;
        let room = rooms.get(&event)?;
        Some((room.live.settings.session_seconds, room.left_at(account)))
    }

    /// The room if this node's view of it is fresher than `max_age`.
    pub fn fresh(&self, event: i64, max_age: Duration) -> Result<Arc<Room>, Freshness> {
        let listed = self.listed_at.read().ok().and_then(|at| *at);
        if listed.is_none_or(|at| at.elapsed() > max_age) {
            return Err(Freshness::Stale);
        }
        let room = self.get(event).ok_or(Freshness::Unknown)?;
        if room.live.read_at.elapsed() > max_age { Err(Freshness::Stale) } else { Ok(room) }
    }

    /// Replaces the view of a room, unless the one held is newer (a join's refresh can race the ticker's).
    pub fn put(&self, event: i64, room: Room) {
        self.gave(event, room.live.counts.seq);
        if let Ok(mut rooms) = self.rooms.write() {
            if rooms.get(&event).is_some_and(|held| held.live.redis_ms > room.live.redis_ms) {
                return;
            }
            rooms.insert(event, Arc::new(room));
        }
    }

    /// Records a successful listing of the configured rooms, forgetting the others.
    pub fn listed(&self, events: &[i64]) {
        if let Ok(mut rooms) = self.rooms.write() {
            rooms.retain(|id, _| events.contains(id));
        }
        if let Ok(mut at) = self.listed_at.write() {
            *at = Some(Instant::now());
        }
    }

    pub fn events(&self) -> Vec<i64> {
        self.rooms.read().map(|r| r.keys().copied().collect()).unwrap_or_default()
    }

    /// Notes that `account` polled, to be flushed to Redis with the others.
    pub fn seen(&self, event: i64, account: &str) {
        if let Ok(mut seen) = self.seen.lock() {
            let set = seen.entry(event).or_default();
            if !set.contains(account) {
                set.insert(account.to_owned());
            }
        }
    }

    /// Whether the room has nothing for an admission step to do, as this node sees it: nobody waiting or in a
    /// pre-queue, no pre-queue to open, no poll to count, and no place given out here since the view was read.
    pub fn quiet(&self, event: i64) -> bool {
        let Some(room) = self.get(event) else { return false };
        let live = &room.live;
        let polled = self.seen.lock().map_or(true, |s| s.get(&event).is_some_and(|set| !set.is_empty()));
        live.waiting() == 0
            && live.counts.prequeue == 0
            && live.settings.state != QueueState::Prequeue
            && !polled
            && self.floor(event) <= live.counts.seq
    }

    /// Takes the accounts seen since the last call.
    pub fn take_seen(&self, event: i64) -> Vec<String> {
        self.seen.lock().ok().and_then(|mut s| s.remove(&event)).map(|s| s.into_iter().collect()).unwrap_or_default()
    }
}

/// Why a room's view could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// No waiting room is configured for the event (as of the last refresh).
    Unknown,
    /// The view is older than allowed: Redis is not answering.
    Stale,
}

#[cfg(test)]
mod tests;
