//! Presale codes (per room, with an index across rooms) and demo sign-in codes.

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;

use super::*;

impl QueueStore {
    /// Adds a batch of presale codes to `event`'s room (normalised, as the join script reads them). `Ok(false)`,
    /// and nothing written, when one of them is in the room already (an operator's own code chosen twice).
    pub async fn add_codes(
        &self,
        event: i64,
        batch: &crate::codes::Batch,
        codes: &[String],
    ) -> Result<bool, StoreError> {
        let k = self.keys(event);
        let mut conn = self.conn.clone();
        let taken: Vec<bool> = self
            .run(redis::cmd("HMGET").arg(k.key("codes")).arg(codes).query_async::<Vec<Option<String>>>(&mut conn))
            .await?
            .into_iter()
            .map(|v| v.is_some())
            .collect();
        if taken.iter().any(|t| *t) {
            return Ok(false);
        }
        let stored = batch.stored();
        let meta = serde_json::to_string(batch).map_err(|e| StoreError::Reply(e.to_string()))?;
        let mut pipe = redis::pipe();
        pipe.atomic();
        for chunk in codes.chunks(1000) {
            let fields: Vec<(&str, &str)> = chunk.iter().map(|c| (c.as_str(), stored.as_str())).collect();
            pipe.hset_multiple(k.key("codes"), &fields).ignore();
        }
        pipe.hset(k.key("codebatches"), &batch.batch, meta).ignore();
        let () = self.run(pipe.query_async(&mut conn)).await?;
        self.replicate(event, false).await?;
        let mut index = redis::pipe();
        for chunk in codes.chunks(1000) {
            let fields: Vec<(&str, i64)> = chunk.iter().map(|c| (c.as_str(), event)).collect();
            index.hset_multiple(codes_index_key(&self.prefix), &fields).ignore();
        }
        let () = self.run(index.query_async(&mut conn)).await?;
        Ok(true)
    }

    /// The room a presale code was made for, if any.
    pub async fn code_room(&self, code: &str) -> Result<Option<i64>, StoreError> {
        let mut conn = self.conn.clone();
        self.run(conn.hget(codes_index_key(&self.prefix), code)).await
    }

    /// `event`'s presale codes: each batch with its redemptions counted, and who redeemed what (newest first,
    /// at most `crate::codes::MAX_LISTED`).
    pub async fn codes_report(&self, event: i64) -> Result<crate::codes::Report, StoreError> {
        use crate::codes::{Batch as CodeBatch, BatchView, MAX_LISTED, Redemption, Report};
        let k = self.keys(event);
        let mut conn = self.conn.clone();
        let (batches, uses, holders): (HashMap<String, String>, HashMap<String, u64>, u64) = self
            .run(
                redis::pipe()
                    .atomic()
                    .hgetall(k.key("codebatches"))
                    .hgetall(k.key("uses"))
                    .hlen(k.key("holders"))
                    .query_async(&mut conn),
            )
            .await?;
        // Which batch each redeemed code is of.
        let redeemed_codes: Vec<&String> = uses.keys().collect();
        let metas: Vec<Option<String>> = if redeemed_codes.is_empty() {
            Vec::new()
        } else {
            self.run(redis::cmd("HMGET").arg(k.key("codes")).arg(&redeemed_codes).query_async(&mut conn)).await?
        };
        let mut by_batch: HashMap<String, u64> = HashMap::new();
        for (code, meta) in redeemed_codes.iter().zip(metas) {
            if let Some(batch) = meta.as_deref().and_then(|m| m.split(':').next()) {
                *by_batch.entry(batch.to_owned()).or_default() += uses[*code];
            }
        }
        let mut views: Vec<BatchView> = batches
            .values()
            .filter_map(|json| serde_json::from_str::<CodeBatch>(json).ok())
            .map(|batch| BatchView { redeemed: by_batch.get(&batch.batch).copied().unwrap_or(0), batch })
            .collect();
        views.sort_by(|a, b| (a.batch.created_at, &a.batch.batch).cmp(&(b.batch.created_at, &b.batch.batch)));
        let mut redemptions = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, page): (u64, Vec<(String, String)>) = self
                .run(
                    redis::cmd("HSCAN").arg(k.key("holders")).arg(cursor).arg("COUNT").arg(1000).query_async(&mut conn),
                )
                .await?;
            for (account, value) in page {
                if let Some((code, at_ms)) = value.rsplit_once(':') {
                    let at = at_ms.parse::<u64>().unwrap_or(0) / 1000;
                    redemptions.push(Redemption { account, code: code.to_owned(), at });
                }
            }
            cursor = next;
            if cursor == 0 || redemptions.len() >= MAX_LISTED {
                break;
            }
        }
        redemptions.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| a.account.cmp(&b.account)));
        redemptions.truncate(MAX_LISTED);
        Ok(Report { event_id: event, batches: views, redeemed_total: holders, redemptions })
    }

    /// Keeps a demo sign-in code for `lifetime`: exchanged once, for `account_token`.
    pub async fn put_signin_code(&self, code: &str, account_token: &str, lifetime: Duration) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let seconds = lifetime.as_secs().max(1);
        let () = self.run(conn.set_ex(signin_key(&self.prefix, code), account_token, seconds)).await?;
        Ok(())
    }

    /// The account token a demo sign-in code was made for, once: the code is gone as it is read.
    pub async fn take_signin_code(&self, code: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.conn.clone();
        self.run(conn.get_del(signin_key(&self.prefix, code))).await
    }
}
