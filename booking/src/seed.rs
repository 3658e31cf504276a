//! The demo seeder: a synthetic stadium, an event in it, ticket types priced by section, and allocations for
//! every seat but a sponsor block, which stays held back (no allocation row) to show the indirection.

use sqlx::PgPool;

/// Seats per row and rows per section of the synthetic stadium.
const SEATS_PER_ROW: i64 = 25;
const ROWS_PER_SECTION: i64 = 20;

/// What to seed.
#[derive(Debug, Clone)]
pub struct SeedOptions {
    /// Total seats in the venue.
    pub seats: u32,
    pub venue_name: String,
    pub event_name: String,
    /// Seats held back for sponsors (the first rows of the first section), never allocated.
    pub sponsor_seats: u32,
}

impl Default for SeedOptions {
    fn default() -> Self {
        Self { seats: 20_000, venue_name: "Demo Stadium".into(), event_name: "Demo on-sale".into(), sponsor_seats: 50 }
    }
}

/// What was seeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seeded {
    pub event_id: i64,
    pub seats: i64,
    pub allocated: i64,
}

/// Creates the venue, event, ticket types and allocations in one transaction.
pub async fn seed(pool: &PgPool, opts: &SeedOptions) -> anyhow::Result<Seeded> {
    anyhow::ensure!(opts.seats > 0, "a venue needs at least one seat");
    anyhow::ensure!(opts.sponsor_seats < opts.seats, "the sponsor block must leave seats on sale");
    let mut tx = pool.begin().await?;
    let venue: i64 = sqlx::query_scalar("INSERT INTO venues (name) VALUES ($1) RETURNING id")
        .bind(&opts.venue_name)
        .fetch_one(&mut *tx)
        .await?;
    let per_section = SEATS_PER_ROW * ROWS_PER_SECTION;
    let sections = (i64::from(opts.seats) + per_section - 1) / per_section;
    // Sections are "Block 101", "Block 102", ... laid out eight to a ring row on the map.
    sqlx::query(
        "INSERT INTO sections (venue_id, name)
         SELECT $1, 'Block ' || (100 + s) FROM generate_series(1, $2) AS s",
    )
    .bind(venue)
    .bind(sections)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "WITH numbered AS (
             SELECT i, i / ($3 * $4) AS sec_idx, (i % ($3 * $4)) / $3 AS row_idx, i % $3 + 1 AS num
             FROM generate_series(0, $2 - 1) AS i
         ), sec AS (
             SELECT id, row_number() OVER (ORDER BY id) - 1 AS sec_idx FROM sections WHERE venue_id = $1
         )
         INSERT INTO seats (section_id, row_label, number, x, y, accessible, label)
         SELECT sec.id, chr(65 + n.row_idx::int), n.num,
                (n.sec_idx % 8) * ($3 + 2) + n.num, (n.sec_idx / 8) * ($4 + 2) + n.row_idx,
                n.row_idx = $4 - 1 AND n.num <= 2,
                'Block ' || (101 + n.sec_idx) || ' Row ' || chr(65 + n.row_idx::int) || ' Seat ' || n.num
         FROM numbered n JOIN sec ON sec.sec_idx = n.sec_idx",
    )
    .bind(venue)
    .bind(i64::from(opts.seats))
    .bind(SEATS_PER_ROW)
    .bind(ROWS_PER_SECTION)
    .execute(&mut *tx)
    .await?;
    let event: i64 = sqlx::query_scalar(
        "INSERT INTO events (venue_id, name, starts_at, currency)
         VALUES ($1, $2, date_trunc('day', now()) + interval '30 days 20 hours', 'EUR') RETURNING id",
    )
    .bind(venue)
    .bind(&opts.event_name)
    .fetch_one(&mut *tx)
    .await?;
    // Three price tiers by section: the first quarter of sections are Premium, the next half Standard, the
    // rest Value.
    sqlx::query(
        "INSERT INTO ticket_types (event_id, name, price_cents)
         VALUES ($1, 'Premium', 12000), ($1, 'Standard', 7500), ($1, 'Value', 4500)",
    )
    .bind(event)
    .execute(&mut *tx)
    .await?;
    let allocated = sqlx::query(
        "WITH ranked AS (
             SELECT s.id AS seat_id,
                    row_number() OVER (ORDER BY sec.id, s.row_label, s.number) AS seat_rank,
                    dense_rank() OVER (ORDER BY sec.id) AS sec_rank,
                    count(*) OVER () AS total_seats
             FROM seats s JOIN sections sec ON sec.id = s.section_id WHERE sec.venue_id = $1
         ), tiers AS (
             SELECT r.seat_id, r.seat_rank,
                    CASE WHEN r.sec_rank <= greatest(1, $3 / 4) THEN 'Premium'
                         WHEN r.sec_rank <= greatest(1, ($3 * 3) / 4) THEN 'Standard'
                         ELSE 'Value' END AS tier
             FROM ranked r
         )
         INSERT INTO seat_allocations (event_id, seat_id, ticket_type_id)
         SELECT $2, tiers.seat_id, tt.id
         FROM tiers JOIN ticket_types tt ON tt.event_id = $2 AND tt.name = tiers.tier
         WHERE tiers.seat_rank > $4",
    )
    .bind(venue)
    .bind(event)
    .bind(sections)
    .bind(i64::from(opts.sponsor_seats))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    // Fresh statistics, so the first checkouts are planned with index scans, not with plans made for the
    // empty tables autovacuum last saw.
    sqlx::query("ANALYZE venues, sections, seats, events, ticket_types, seat_allocations").execute(pool).await?;
    Ok(Seeded { event_id: event, seats: i64::from(opts.seats), allocated: allocated as i64 })
}

/// The first event, if any: the demo stack seeds only when there is none, and keeps its demo event as later
/// events (load-test replays) are added.
pub async fn first_event(pool: &PgPool) -> anyhow::Result<Option<i64>> {
    Ok(sqlx::query_scalar("SELECT min(id) FROM events").fetch_one(pool).await?)
}
