#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The PostgreSQL test harness (`testing::PostgresServer`): it starts a
//! server sqlx can use, checks the password, and survives a kill and a
//! restart with its data.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, Row};
use tollgate_configapi::testing::PostgresServer;

/// A pool that gives up quickly when the server is down.
async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(3))
        .connect(url)
        .await
        .unwrap()
}

#[tokio::test]
async fn serves_checks_the_password_and_keeps_data_across_kill_and_restart() {
    let mut pg = PostgresServer::start();
    let url = pg.url();
    assert!(url.starts_with("postgres://"), "{url}");
    assert!(url.contains("@127.0.0.1:"), "{url}");

    let pool = pool(&url).await;
    sqlx::query("CREATE TABLE harness (id BIGINT PRIMARY KEY, name TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO harness (id, name) VALUES (1, 'kept')")
        .execute(&pool)
        .await
        .unwrap();

    // The password really is checked, over TCP.
    let options: PgConnectOptions = url.parse().unwrap();
    let refused = options
        .clone()
        .password("not-the-password")
        .connect()
        .await
        .expect_err("a wrong password was accepted");
    let code = refused
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("28P01"), "{refused}"); // invalid_password
    let mut conn = options.connect().await.unwrap();
    conn.ping().await.unwrap();
    conn.close().await.unwrap();

    pg.kill();
    assert!(
        PgConnection::connect(&url).await.is_err(),
        "connected to a killed server"
    );
    assert!(
        sqlx::query("SELECT 1").execute(&pool).await.is_err(),
        "a pooled connection outlived the server"
    );

    pg.restart();
    assert_eq!(pg.url(), url, "restarted elsewhere");
    let name: String = sqlx::query("SELECT name FROM harness WHERE id = 1")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, "kept");
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM harness")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(count, 1);
    conn.close().await.unwrap();
    pool.close().await;
}

#[tokio::test]
async fn parallel_servers_have_their_own_port_and_data() {
    let starts: Vec<_> = (0..3)
        .map(|_| tokio::task::spawn_blocking(PostgresServer::start))
        .collect();
    let mut servers = Vec::new();
    for start in starts {
        servers.push(start.await.unwrap());
    }
    let mut urls: Vec<String> = servers.iter().map(PostgresServer::url).collect();
    urls.sort();
    urls.dedup();
    assert_eq!(urls.len(), servers.len(), "{urls:?}");

    let first = pool(&servers[0].url()).await;
    sqlx::query("CREATE TABLE only_here (id BIGINT)")
        .execute(&first)
        .await
        .unwrap();
    for other in &servers[1..] {
        let pool = pool(&other.url()).await;
        let exists: bool = sqlx::query_scalar("SELECT to_regclass('only_here') IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(!exists, "a table showed up on another server");
        pool.close().await;
    }
    first.close().await;
}

#[test]
fn restart_of_a_running_server_and_drop() {
    let mut pg = PostgresServer::start();
    pg.restart();
    pg.kill();
    pg.kill();
    drop(pg);
}
