//! The store's own small connection pool.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, OnceLock};

use futures_util::future::join_all;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient, NoTls, Row, Statement};

use crate::error::StoreError;

/// A small pool: at most `permits` connections, idle ones kept for reuse.
#[derive(Debug)]
pub(super) struct Pool {
    pub(super) config: tokio_postgres::Config,
    pub(super) schema: Option<String>,
    idle: Mutex<Vec<(Client, Statements)>>,
    permits: Semaphore,
    max_connections: usize,
    /// The statements every connection prepares as it opens, once [`Pool::warm`] named them.
    ahead: OnceLock<&'static [&'static str]>,
}

/// The statements prepared on one connection, by their text: a statement is parsed and
/// planned once per connection instead of at every use (one round trip instead of two).
#[derive(Debug, Default)]
pub(super) struct Statements(HashMap<Box<str>, Statement>);

impl Statements {
    /// `sql` prepared on `client`'s connection (on first use).
    pub(super) async fn get(
        &mut self,
        client: &impl GenericClient,
        sql: &str,
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.0.get(sql) {
            return Ok(statement.clone());
        }
        let statement = client.prepare(sql).await?;
        self.0.insert(sql.into(), statement.clone());
        Ok(statement)
    }

    /// Prepares those of `sqls` not prepared yet, all at once (one round trip), then plans
    /// them (one more). One that fails is left to its first use, which reports the error.
    async fn prepare_ahead(&mut self, client: &Client, sqls: &[&str]) {
        let missing: Vec<&str> = sqls
            .iter()
            .copied()
            .filter(|sql| !self.0.contains_key(*sql))
            .collect();
        if missing.is_empty() {
            return;
        }
        let prepared = join_all(missing.iter().map(|sql| client.prepare(sql))).await;
        for (sql, prepared) in missing.iter().zip(prepared) {
            match prepared {
                Ok(statement) => {
                    self.0.insert((*sql).into(), statement);
                }
                Err(error) => {
                    tracing::debug!(%error, sql, "postgres store: a statement not prepared ahead");
                }
            }
        }
        if !sqls.iter().any(|sql| self.0.contains_key(*sql)) {
            tracing::warn!(
                statements = sqls.len(),
                "postgres store: no statement could be prepared ahead; each is at its first use"
            );
            return;
        }
        if let Err(error) = client.batch_execute(PLAN_PREPARED).await {
            tracing::debug!(%error, "postgres store: the statements were not planned ahead");
        }
    }
}

/// Plans each statement prepared on the connection, without running it: `EXPLAIN EXECUTE`
/// builds a prepared statement's generic plan (the one every use of it runs, under
/// `plan_cache_mode = force_generic_plan`) and keeps it with the statement, or finds it kept
/// already. A statement with parameters is explained with each one `NULL`, which a generic
/// plan does not look at; one that cannot be explained is left to be planned at first use.
const PLAN_PREPARED: &str = "DO $$ DECLARE s record; BEGIN \
    FOR s IN SELECT name, cardinality(parameter_types) AS n FROM pg_prepared_statements \
        WHERE NOT from_sql LOOP \
        BEGIN \
            EXECUTE format('EXPLAIN EXECUTE %I%s', s.name, CASE WHEN s.n = 0 THEN '' ELSE \
                '(' || array_to_string(array_fill('NULL'::text, ARRAY[s.n]), ',') || ')' END); \
        EXCEPTION WHEN OTHERS THEN NULL; \
        END; \
    END LOOP; END $$";

/// A pooled connection, returned to the pool on drop unless it closed.
pub(super) struct PooledClient<'a> {
    client: Option<Client>,
    statements: Statements,
    /// A transaction is open on the connection ([`PooledClient::begin`]).
    in_transaction: bool,
    pool: &'a Pool,
    _permit: SemaphorePermit<'a>,
}

impl Pool {
    pub(super) fn new(
        config: tokio_postgres::Config,
        schema: Option<String>,
        max_connections: usize,
    ) -> Self {
        Self {
            config,
            schema,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(max_connections),
            max_connections,
            ahead: OnceLock::new(),
        }
    }

    /// Opens up to `connections` connections (at most the pool's size) and prepares and plans
    /// `statements` on each, as every connection opened from now on does.
    pub(super) async fn warm(
        &self,
        statements: &'static [&'static str],
        connections: usize,
    ) -> Result<(), StoreError> {
        let statements = *self.ahead.get_or_init(|| statements);
        // Held together until all are ready, so each is another connection.
        let warmed = join_all((0..connections.min(self.max_connections)).map(|_| async {
            let mut conn = self.get().await?;
            let (client, prepared) = conn.split();
            prepared.prepare_ahead(client, statements).await;
            Ok::<_, StoreError>(conn)
        }))
        .await;
        warmed.into_iter().try_for_each(|conn| conn.map(drop))
    }

    pub(super) async fn get(&self) -> Result<PooledClient<'_>, StoreError> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StoreError::Config {
                detail: "the connection pool is closed".to_owned(),
            })?;
        let reused = loop {
            let next = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match next {
                Some((c, _)) if c.is_closed() => continue,
                other => break other,
            }
        };
        let (client, statements) = match reused {
            Some(reused) => reused,
            None => self.connect().await?,
        };
        Ok(PooledClient {
            client: Some(client),
            statements,
            in_transaction: false,
            pool: self,
            _permit: permit,
        })
    }

    async fn connect(&self) -> Result<(Client, Statements), StoreError> {
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(%error, "postgres store: connection ended");
            }
        });
        // Each statement is planned once per connection, not again at every call with its
        // values: all of them look rows up by key or scan an index in order, and the planning
        // of a queue claim, redone for each `LIMIT`, cost more than running it.
        let mut setup = String::from("SET plan_cache_mode = force_generic_plan");
        if let Some(schema) = &self.schema {
            setup.push_str(&format!("; SET search_path TO \"{schema}\""));
        }
        client.batch_execute(&setup).await?;
        let mut statements = Statements::default();
        if let Some(ahead) = self.ahead.get() {
            statements.prepare_ahead(&client, ahead).await;
        }
        Ok((client, statements))
    }
}

#[cfg(test)]
impl Pool {
    /// The statements each idle connection has prepared.
    pub(super) fn idle_prepared(&self) -> Vec<std::collections::BTreeSet<String>> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let texts = |statements: &Statements| statements.0.keys().map(|k| k.to_string()).collect();
        idle.iter()
            .map(|(_, statements)| texts(statements))
            .collect()
    }
}

impl PooledClient<'_> {
    /// The connection and its prepared statements, to use both inside a transaction.
    pub(super) fn split(&mut self) -> (&mut Client, &mut Statements) {
        let client = self.client.as_mut().unwrap_or_else(|| unreachable!());
        (client, &mut self.statements)
    }

    /// The connection and its statements for a transaction whose `BEGIN` the caller sends
    /// with its first statements (saving it a round trip of its own), ended by
    /// [`end`](Self::end). Until then the connection counts as in a transaction: dropped in
    /// one, it is closed rather than pooled, and the server rolls the transaction back.
    pub(super) fn begin(&mut self) -> (&Client, &mut Statements) {
        self.in_transaction = true;
        let (client, statements) = self.split();
        (&*client, statements)
    }

    /// Ends the transaction opened after [`begin`](Self::begin) with `COMMIT` or `ROLLBACK`.
    pub(super) async fn end(&mut self, how: End) -> Result<(), tokio_postgres::Error> {
        let sql = match how {
            End::Commit => "COMMIT",
            End::Rollback => "ROLLBACK",
        };
        self.batch_execute(sql).await?;
        self.in_transaction = false;
        Ok(())
    }
}

/// How [`PooledClient::end`] ends a transaction.
#[derive(Debug, Clone, Copy)]
pub(super) enum End {
    Commit,
    Rollback,
}

type Params<'p> = &'p [&'p (dyn ToSql + Sync)];

/// A client or a transaction whose statements, given by their text, are prepared once per
/// connection.
pub(super) struct Prepared<'a, C> {
    pub(super) client: &'a C,
    pub(super) statements: &'a mut Statements,
}

impl<C: GenericClient + Sync> Prepared<'_, C> {
    pub(super) async fn query(
        &mut self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let statement = self.statements.get(self.client, sql).await?;
        self.client.query(&statement, params).await
    }

    pub(super) async fn query_opt(
        &mut self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        let statement = self.statements.get(self.client, sql).await?;
        self.client.query_opt(&statement, params).await
    }

    pub(super) async fn query_one(
        &mut self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Row, tokio_postgres::Error> {
        let statement = self.statements.get(self.client, sql).await?;
        self.client.query_one(&statement, params).await
    }

    pub(super) async fn execute(
        &mut self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<u64, tokio_postgres::Error> {
        let statement = self.statements.get(self.client, sql).await?;
        self.client.execute(&statement, params).await
    }
}

impl PooledClient<'_> {
    /// The connection, its statements prepared once.
    pub(super) fn prepared(&mut self) -> Prepared<'_, Client> {
        let (client, statements) = self.split();
        Prepared {
            client: &*client,
            statements,
        }
    }
}

impl Deref for PooledClient<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        // Present from construction until drop.
        self.client.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl DerefMut for PooledClient<'_> {
    fn deref_mut(&mut self) -> &mut Client {
        self.client.as_mut().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for PooledClient<'_> {
    fn drop(&mut self) {
        if let Some(client) = self.client.take()
            && !client.is_closed()
            && !self.in_transaction
        {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((client, std::mem::take(&mut self.statements)));
        }
    }
}
