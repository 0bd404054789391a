//! The store's own small connection pool.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::{Client, NoTls};

use crate::error::StoreError;

/// A small pool: at most `permits` connections, idle ones kept for reuse.
#[derive(Debug)]
pub(super) struct Pool {
    pub(super) config: tokio_postgres::Config,
    pub(super) schema: Option<String>,
    idle: Mutex<Vec<Client>>,
    permits: Semaphore,
}

/// A pooled connection, returned to the pool on drop unless it closed.
pub(super) struct PooledClient<'a> {
    client: Option<Client>,
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
        }
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
                Some(c) if c.is_closed() => continue,
                other => break other,
            }
        };
        let client = match reused {
            Some(c) => c,
            None => self.connect().await?,
        };
        Ok(PooledClient {
            client: Some(client),
            pool: self,
            _permit: permit,
        })
    }

    async fn connect(&self) -> Result<Client, StoreError> {
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(%error, "postgres store: connection ended");
            }
        });
        if let Some(schema) = &self.schema {
            client
                .batch_execute(&format!("SET search_path TO \"{schema}\""))
                .await?;
        }
        Ok(client)
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
        {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(client);
        }
    }
}
