//! The recorded pre-queue draw and lottery draws, for anyone to recompute.

use std::collections::HashMap;

use super::*;

/// The recorded pre-queue draw, for anyone to recompute.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Draw {
    pub seed: u64,
    pub base: u64,
    pub at_ms: u64,
    /// The accounts in the order they joined the pre-queue.
    pub join_order: Vec<String>,
}

impl QueueStore {
    /// The recorded pre-queue draw, once the pre-queue has opened.
    pub async fn draw(&self, event: i64) -> Result<Option<Draw>, StoreError> {
        let k = self.keys(event);
        let mut conn = self.conn.clone();
        let (shuffle, join_order): (HashMap<String, u64>, Vec<String>) = self
            .run(
                redis::pipe().atomic().hgetall(k.key("shuffle")).lrange(k.key("prelist"), 0, -1).query_async(&mut conn),
            )
            .await?;
        // A lottery's pools follow the pre-queue's accounts in the list.
        let count = shuffle.get("count").map_or(join_order.len(), |&n| n as usize);
        Ok(shuffle.get("seed").map(|&seed| Draw {
            seed,
            base: shuffle.get("base").copied().unwrap_or(0),
            at_ms: shuffle.get("at_ms").copied().unwrap_or(0),
            join_order: join_order.into_iter().take(count).collect(),
        }))
    }

    /// A `lottery` room's draw step (`lua/queue_draw.lua`): how many places it drew now, if it drew.
    pub async fn draw_lottery(&self, event: i64, seed: u64) -> Result<Option<u64>, StoreError> {
        let mut inv = self.script(&self.scripts.draw, event);
        inv.arg(seed);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        match p.first().map(String::as_str) {
            Some("idle" | "waiting") => Ok(None),
            Some("drawn") => Ok(Some(number(&p, 1)?)),
            _ => Err(StoreError::Reply(p.join(" "))),
        }
    }

    /// A `lottery` room's recorded draws, oldest first, each with the pool it drew in join order.
    pub async fn lottery_draws(&self, event: i64) -> Result<Vec<Draw>, StoreError> {
        let k = self.keys(event);
        let mut conn = self.conn.clone();
        let (records, join_order): (Vec<String>, Vec<String>) = self
            .run(
                redis::pipe()
                    .atomic()
                    .lrange(k.key("draws"), 0, -1)
                    .lrange(k.key("prelist"), 0, -1)
                    .query_async(&mut conn),
            )
            .await?;
        records
            .iter()
            .map(|r| {
                let n: Vec<u64> = r.split(':').filter_map(|p| p.parse().ok()).collect();
                let [seed, from, count, base, at_ms] = n[..] else { return Err(StoreError::Reply(r.clone())) };
                let pool = join_order.iter().skip(from as usize).take(count as usize).cloned().collect();
                Ok(Draw { seed, base, at_ms, join_order: pool })
            })
            .collect()
    }
}
