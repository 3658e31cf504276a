//! A room's settings and state, its schedule of changes, its adaptive rate and challenge difficulty, and the
//! registry of rooms and gateway nodes.

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;

use super::*;
use crate::room::{Applied, SCHEDULE_MAX, Scheduled, Settings, SettingsPatch};

/// The outcome of an operator's change.
#[derive(Debug, Clone)]
pub struct Configured {
    pub settings: Settings,
    pub change: Option<StateChange>,
}

impl QueueStore {
    /// The events that have a waiting room.
    pub async fn rooms(&self) -> Result<Vec<i64>, StoreError> {
        let mut conn = self.conn.clone();
        let members: Vec<String> = self.run(conn.smembers(rooms_key(&self.prefix))).await?;
        Ok(members.iter().filter_map(|m| m.parse().ok()).collect())
    }

    /// The room's settings straight from Redis.
    pub async fn settings(&self, event: i64) -> Result<Option<Settings>, StoreError> {
        let mut conn = self.conn.clone();
        let hash: HashMap<String, String> = self.run(conn.hgetall(self.keys(event).key("settings"))).await?;
        Ok(Settings::from_hash(&hash))
    }

    /// Creates the room with defaults when it does not exist, then applies `patch` (the state last, through
    /// `set_state`). Returns the settings as stored.
    pub async fn configure(&self, event: i64, patch: &SettingsPatch, seed: u64) -> Result<Configured, StoreError> {
        let k = self.keys(event);
        let settings_key = k.key("settings");
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (field, value) in Settings::DEFAULT.fields() {
            pipe.hset_nx(&settings_key, field, value).ignore();
        }
        let mut fields: Vec<(&str, String)> = Vec::new();
        let numbers = [
            ("admit_per_minute", patch.admit_per_minute),
            ("max_active", patch.max_active),
            ("session_seconds", patch.session_seconds),
            ("abandon_after_seconds", patch.abandon_after_seconds),
            ("challenge_difficulty", patch.challenge_difficulty),
            ("challenge_min_difficulty", patch.challenge_min_difficulty),
            ("challenge_max_difficulty", patch.challenge_max_difficulty),
            ("challenge_window_seconds", patch.challenge_window_seconds),
            ("places_per_network", patch.places_per_network),
            ("rate_floor", patch.rate_floor),
            ("rate_ceiling", patch.rate_ceiling),
            ("target_p99_ms", patch.target_p99_ms),
            ("target_503_percent", patch.target_503_percent),
            ("draw_every_seconds", patch.draw_every_seconds),
        ];
        fields.extend(numbers.iter().filter_map(|(name, v)| v.map(|v| (*name, v.to_string()))));
        if let Some(at) = patch.opens_at {
            fields.push(("opens_at", (at * 1000).to_string()));
        }
        if let Some(mode) = patch.challenge {
            fields.push(("challenge", mode.as_str().to_owned()));
        }
        if let Some(held) = patch.infinite_queue_for_failed {
            fields.push(("infinite_queue_for_failed", u8::from(held).to_string()));
        }
        if let Some(access) = patch.access {
            fields.push(("access", access.as_str().to_owned()));
        }
        if let Some(queueing) = patch.queueing {
            fields.push(("queueing", queueing.as_str().to_owned()));
        }
        if let Some(all) = patch.queue_all {
            fields.push(("queue_all", u8::from(all).to_string()));
        }
        if let Some(mode) = patch.rate_mode {
            fields.push(("rate_mode", mode.as_str().to_owned()));
            // A new mode starts afresh: adaptive from the operators' rate within the bounds.
            pipe.hdel(&settings_key, &["rate_in_force", "rate_reason"]).ignore();
        }
        if !fields.is_empty() {
            pipe.hset_multiple(&settings_key, &fields).ignore();
            pipe.hincr(&settings_key, "version", 1).ignore();
        }
        let () = self.run(pipe.query_async(&mut conn)).await?;
        self.replicate(event, false).await?;
        // An operator's change makes a retired room anew, empty.
        let _: i64 = self.run(conn.srem(retired_key(&self.prefix), event)).await?;
        self.list_room(event).await?;
        let change = match patch.state {
            Some(state) => Some(self.set_state(event, state, seed, None).await?),
            None => None,
        };
        let settings = self.settings(event).await?.ok_or_else(|| StoreError::Reply("settings vanished".into()))?;
        Ok(Configured { settings, change })
    }

    /// Writes back a room's settings that Redis lost (a flush, a failover to a replica that never had them), as a
    /// node last read them; a field written meanwhile (an operator's change) is kept. The queue's places and
    /// counters are not restored: they are gone with the data.
    pub async fn restore(&self, event: i64, settings: &Settings) -> Result<(), StoreError> {
        let settings_key = self.keys(event).key("settings");
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (field, value) in settings.fields() {
            pipe.hset_nx(&settings_key, field, value).ignore();
        }
        let () = self.run(pipe.query_async(&mut conn)).await?;
        self.replicate(event, false).await?;
        self.list_room(event).await
    }

    /// Retires the room: marks it retired (so that no node restores it from its view), takes it off the list of
    /// rooms, then deletes its presale codes from the index and every key it has but its place counter
    /// (`lua/queue_retire.lua`). Returns whether there was anything to retire; retiring again does nothing.
    pub async fn retire(&self, event: i64) -> Result<bool, StoreError> {
        let k = self.keys(event);
        let mut conn = self.conn.clone();
        let _: i64 = self.run(conn.sadd(retired_key(&self.prefix), event)).await?;
        let listed: i64 = self.run(conn.srem(rooms_key(&self.prefix), event)).await?;
        let codes: Vec<String> = self.run(conn.hkeys(k.key("codes"))).await?;
        let index = codes_index_key(&self.prefix);
        for chunk in codes.chunks(1000) {
            // A code of the same text in another room keeps its entry.
            let rooms: Vec<Option<i64>> =
                self.run(redis::cmd("HMGET").arg(&index).arg(chunk).query_async(&mut conn)).await?;
            let ours: Vec<&String> =
                chunk.iter().zip(rooms).filter(|(_, room)| *room == Some(event)).map(|(c, _)| c).collect();
            if !ours.is_empty() {
                let _: i64 = self.run(conn.hdel(&index, ours)).await?;
            }
        }
        let mut retire = self.scripts.retire.prepare_invoke();
        for key in k.every() {
            retire.key(key);
        }
        let existed: i64 = self.run(retire.invoke_async(&mut conn)).await?;
        Ok(listed > 0 || existed > 0)
    }

    /// Which of `events` are retired.
    pub async fn retired_among(&self, events: &[i64]) -> Result<Vec<bool>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        self.run(redis::cmd("SMISMEMBER").arg(retired_key(&self.prefix)).arg(events).query_async(&mut conn)).await
    }

    /// Adds the event to the set of rooms, after its settings are written. The set has no hash tag (it spans
    /// every event), so on a cluster it lives in another slot than the room and cannot share its transaction; a
    /// room written but not yet listed is listed by the next `configure` or `restore`.
    async fn list_room(&self, event: i64) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = self.run(conn.sadd(rooms_key(&self.prefix), event)).await?;
        Ok(())
    }

    /// Records whether every seat left is held or awaiting payment, and what may come back when (`all_held`
    /// and `held_*` in the room's settings): the admission step admits nobody while it is, and every node
    /// reads it with the room.
    /// `ending`: the last seats are selling.
    pub async fn set_all_held(
        &self,
        event: i64,
        held: Option<crate::room::HeldBack>,
        ending: bool,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let key = self.keys(event).key("settings");
        let mut fields = match held {
            Some(h) => {
                vec![("all_held", 1), ("held_seats", h.seats), ("held_next_release", h.next_release_ms.unwrap_or(0))]
            }
            None => vec![("all_held", 0)],
        };
        fields.push(("ending", u64::from(ending)));
        let () = self.run(conn.hset_multiple(key, &fields)).await?;
        Ok(())
    }

    /// The `auto` challenge's step (`lua/queue_tune_challenge.lua`): the difficulty in force after it, when the
    /// room's challenge is `auto`.
    pub async fn tune_challenge(&self, event: i64) -> Result<Option<u64>, StoreError> {
        let inv = self.script(&self.scripts.tune, event);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        match p.first().map(String::as_str) {
            Some("manual") => Ok(None),
            Some("waiting") => Ok(Some(number(&p, 1)?)),
            Some("tuned") => {
                let difficulty = number(&p, 1)?;
                tracing::debug!(event, difficulty, joins = %p[2], capacity = %p[3], "challenge difficulty decided");
                Ok(Some(difficulty))
            }
            _ => Err(StoreError::Reply(p.join(" "))),
        }
    }

    /// Adds what this node saw of booking's answers for `event` and, at most once a second across the nodes,
    /// decides an `adaptive` room's rate (`lua/queue_adapt.lua`): the rate in force and why, when decided now.
    pub async fn adapt(&self, event: i64, seen: &crate::health::Report) -> Result<Option<(u64, String)>, StoreError> {
        let mut inv = self.script(&self.scripts.adapt, event);
        inv.arg(seen.answered).arg(seen.slow).arg(seen.unavailable).arg(seen.stalled);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        match p.first().map(String::as_str) {
            Some("fixed" | "waiting") => Ok(None),
            Some("decided") => Ok(Some((number(&p, 1)?, p.get(2).cloned().unwrap_or_default()))),
            _ => Err(StoreError::Reply(p.join(" "))),
        }
    }

    /// Adds a change to `event`'s schedule; `Ok(false)`, and nothing added, when it holds
    /// [`SCHEDULE_MAX`] already.
    pub async fn schedule_add(&self, event: i64, change: &Scheduled) -> Result<bool, StoreError> {
        let key = self.keys(event).key("schedule");
        let mut conn = self.conn.clone();
        let waiting: usize = self.run(conn.zcard(&key)).await?;
        if waiting >= SCHEDULE_MAX {
            return Ok(false);
        }
        let member = serde_json::to_string(change).map_err(|e| StoreError::Reply(e.to_string()))?;
        let _: i64 = self.run(conn.zadd(&key, member, change.at.saturating_mul(1000))).await?;
        self.replicate(event, false).await?;
        Ok(true)
    }

    /// `event`'s schedule: the changes waiting, earliest first, and the last applied, latest first.
    pub async fn schedule(&self, event: i64) -> Result<(Vec<Scheduled>, Vec<Applied>), StoreError> {
        let k = self.keys(event);
        let mut conn = self.conn.clone();
        let (waiting, applied): (Vec<String>, Vec<String>) = self
            .run(redis::pipe().zrange(k.key("schedule"), 0, -1).lrange(k.key("applied"), 0, -1).query_async(&mut conn))
            .await?;
        Ok((parse_all(&waiting), parse_all(&applied)))
    }

    /// Removes the waiting change `id` from `event`'s schedule: whether it was there.
    pub async fn schedule_cancel(&self, event: i64, id: &str) -> Result<bool, StoreError> {
        let key = self.keys(event).key("schedule");
        let mut conn = self.conn.clone();
        let waiting: Vec<String> = self.run(conn.zrange(&key, 0, -1)).await?;
        let Some(member) = waiting.iter().find(|m| serde_json::from_str::<Scheduled>(m).is_ok_and(|c| c.id == id))
        else {
            return Ok(false);
        };
        let removed: i64 = self.run(conn.zrem(&key, member)).await?;
        Ok(removed == 1)
    }

    /// Claims the changes of `event`'s schedule whose time has come (`lua/queue_schedule_take.lua`), earliest
    /// first: this node is to apply them, or [`Self::schedule_add`] them back.
    pub async fn schedule_take_due(&self, event: i64) -> Result<Vec<Scheduled>, StoreError> {
        let mut inv = self.script(&self.scripts.schedule, event);
        inv.arg(SCHEDULE_MAX);
        let mut conn = self.conn.clone();
        let due: Vec<String> = self.run(inv.invoke_async(&mut conn)).await?;
        Ok(parse_all(&due))
    }

    /// Records a scheduled change as applied (the last fifty are kept).
    pub async fn schedule_applied(&self, event: i64, applied: &Applied) -> Result<(), StoreError> {
        let key = self.keys(event).key("applied");
        let entry = serde_json::to_string(applied).map_err(|e| StoreError::Reply(e.to_string()))?;
        let mut conn = self.conn.clone();
        let () = self
            .run(redis::pipe().lpush(&key, entry).ignore().ltrim(&key, 0, 49).ignore().query_async(&mut conn))
            .await?;
        Ok(())
    }

    /// Says this node is alive (or, `leaving`, that it is not) and returns how many nodes are.
    pub async fn register_node(&self, node: &str, alive: Duration, leaving: bool) -> Result<u32, StoreError> {
        let mut inv = self.scripts.nodes.prepare_invoke();
        inv.key(nodes_key(&self.prefix)).arg(node).arg(alive.as_millis() as u64).arg(if leaving { "1" } else { "0" });
        let mut conn = self.conn.clone();
        let count: u64 = self.run(inv.invoke_async(&mut conn)).await?;
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }
}
