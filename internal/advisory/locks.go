// Package advisory names every advisory lock pgconverge takes on the target (PostgreSQL docs
// §13.3.5 "Advisory Locks", §9.27.10 "Advisory Lock Functions", §54.12 "pg_locks"): each lock's
// key, the SQL that takes, tries and releases it, and the pg_locks predicates that tell whether
// a session holds it or waits for it. Its invariant: every pgconverge advisory lock has exactly
// one key, built here, so two kinds of lock never share a key and every user of a lock, on any
// host, computes the same key.
//
// # One key scheme
//
// Every lock is the single-bigint form, pg_advisory_lock(bigint), whose key is the first 64 bits
// of the MD5 of "pgconverge ", the lock's kind, a space and its name (a slot's name, a table's
// qualified name, a backend pid or a run id in decimal, or "" for a lock of which there is one
// per database), computed in SQL by the statement that uses it:
//
//	('x' || substr(md5('pgconverge ' || kind || ' ' || name), 1, 16))::bit(64)::bigint
//
// Why this form, and not the two-int4 form pg_advisory_lock(class, hashtext(name)):
//   - collisions: a collision makes two unrelated holders exclude each other (a daemon waits as
//     the standby of another slot's leader, a backfill waits for another table's); hashtext's
//     32 bits make that likely among a few tens of thousands of names (a birthday bound of about
//     77,000 names for even odds), 64 bits of MD5 never in practice. The kind is hashed with the
//     name, so there is no table of class numbers to keep apart either;
//   - the slot locks (Leader, Standby, Running, Epoch) have used exactly these keys since leaders
//     began, so daemons of this and of earlier versions still exclude each other on them: that
//     is what keeps a rolling upgrade of a slot's daemons to one leader.
//
// Names are hashed with md5, never hashtext: hashtext has only 32 bits, and it is an internal
// function of PostgreSQL's hash indexes that its documentation does not promise to keep.
//
// In pg_locks such a lock is a row with locktype 'advisory', objsubid 1 (the two-int4 form shows
// 2), database the target database's oid, classid the key's high 32 bits and objid its low 32
// bits, both as unsigned oids; its kind and name cannot be read back from the row, only compared
// with a key computed from them (Lock.Is). Advisory locks are per database, so two target
// databases in one cluster never exclude each other.
//
// pgconverge also waits for one advisory lock it does not build: the one tern (the migrator of
// package migrations) takes while it migrates the metadata schema.
package advisory

// Lock is one advisory lock on the target, as the SQL expression of its 64-bit key (the package
// comment gives the scheme). Its methods return SQL: the function calls that take and release it
// (to be used as `select <call>`, or as a FROM item) and boolean conditions over pg_locks. Which
// of them a lock is taken with (session or transaction, shared or exclusive, waiting or trying)
// is part of its kind: each constructor's comment says it, and its users keep to it.
type Lock struct {
	key string
}

// newLock returns the lock of kind named by the SQL expression name (text, or a number that
// concatenates as its decimal text).
func newLock(kind, name string) Lock {
	return Lock{key: `('x' || substr(md5('pgconverge ` + kind + ` ' || ` + name + `), 1, 16))::bit(64)::bigint`}
}

// Leader is slot's leader lock; slot is the SQL expression of the slot's name (such as "$1" or
// "l.slot"). The daemon that leads the slot holds it exclusively, at session level, on a target
// connection of its own (apply.LockLeader, waiting or trying) for as long as it leads: until
// that session ends, whether the daemon stopped, was killed or lost the connection. It excludes
// every other daemon of the slot from leading; they wait for it as standbys.
func Leader(slot string) Lock { return newLock("leader", slot) }

// Standby is slot's standby lock. Each standby daemon of the slot holds it shared, at session
// level, on its leader-lock connection while it waits for the leader lock (apply.MarkStandby
// takes and releases it); nobody takes it exclusively, so it excludes nothing: it is there to be
// counted (apply.ReadLeaders).
func Standby(slot string) Lock { return newLock("standby", slot) }

// Running is slot's running lock. Every daemon of the slot holds it shared, at session level, on
// a target connection of its own for as long as its process runs, across its sessions and the
// backoff between them (apply.MarkRunning); nobody takes it exclusively, so it excludes nothing:
// apply.ReadLeaders reports the slot running while some session holds it.
func Running(slot string) Lock { return newLock("running", slot) }

// Epoch is slot's epoch lock. The leader holds it shared, at session level, on each connection
// that does a leader's work across several transactions (a session start's schema work, a bulk
// load's key deferral, a daemon's backfill run: apply.HoldEpoch, released when that work ends);
// a new leader takes it exclusively for its raising transaction (apply.Lead,
// pg_advisory_xact_lock), so a raise waits for every holder, and a holder sees a raise waiting
// (Awaited, apply.CheckUnchallenged).
func Epoch(slot string) Lock { return newLock("epoch", slot) }

// Run is the lock of backfill run id; id is the SQL expression of the run's id (bigint). The
// process of the run takes it exclusively, at session level, on its control connection in the
// transaction that records the run (coverage.StartRun), and holds it until that session ends or
// releases all its locks at the end of the run (UnlockAll). Nobody else takes it: a run recorded
// running whose lock nobody holds (Held) was left by a process that ended.
func Run(id string) Lock { return newLock("run", id) }

// Backfill is the backfill lock of a table; table is the SQL expression of its qualified name as
// changebatch.TableName.String spells it. A backfill run holds it exclusively, at session level,
// on its control connection for each table it backfills (coverage.LockBackfill, waiting or
// trying), until coverage.UnlockBackfill, UnlockAll or the session's end; it excludes a second
// backfill of the table. The tombstone pruner tries it exclusively for its transaction
// (TryXactLock, coverage.TombstoneHorizon), so it never prunes under a running backfill and a
// backfill waits out a prune; coverage.BackfillHeld looks whether a backfill runs.
func Backfill(table string) Lock { return newLock("backfill", table) }

// Worker is the lock of the backfill worker whose target session is backend pid; pid is the SQL
// expression of the pid (integer, such as "pg_backend_pid()" or "c.claimed_by"). Each worker's
// target session holds its own exclusively, at session level, for the session's life
// (coverage.HoldWorkerLock); no other session can have its pid, so it excludes nothing: a chunk
// claimed by pid stays claimed while the lock is held (Held), and is claimable again once the
// session ended.
func Worker(pid string) Lock { return newLock("worker", pid) }

// Follow is the target's lock for recording which tables the streams follow (one per target
// database). A daemon takes it exclusively, waiting, for the transaction in which it checks that
// no other slot follows its tables and opens their spans (coverage.LockFollowing); it excludes a
// second daemon doing the same at once.
func Follow() Lock { return newLock("follow", "''") }

// DDL is the target's lock for creating objects (one per target database): the metadata schema,
// target tables, their schemas and types. A process takes it exclusively, waiting, at session
// level, on the connection that creates them (migrations.LockDDL) and releases it when done; it
// excludes two processes creating objects at once (CREATE … IF NOT EXISTS of one name in two
// sessions fails on a catalog's unique index).
func DDL() Lock { return newLock("ddl", "''") }

// Key returns the SQL expression of l's key (bigint).
func (l Lock) Key() string { return l.key }

// Lock returns the call that takes l exclusively at session level, waiting (void).
func (l Lock) Lock() string { return "pg_advisory_lock(" + l.key + ")" }

// TryLock returns the call that takes l exclusively at session level without waiting: true
// when it got the lock, false when another session holds it.
func (l Lock) TryLock() string { return "pg_try_advisory_lock(" + l.key + ")" }

// Unlock returns the call that releases one exclusive session-level hold of l (true when the
// session held it).
func (l Lock) Unlock() string { return "pg_advisory_unlock(" + l.key + ")" }

// LockShared returns the call that takes l shared at session level, waiting (void).
func (l Lock) LockShared() string { return "pg_advisory_lock_shared(" + l.key + ")" }

// UnlockShared returns the call that releases one shared session-level hold of l.
func (l Lock) UnlockShared() string { return "pg_advisory_unlock_shared(" + l.key + ")" }

// XactLock returns the call that takes l exclusively until the transaction ends, waiting (void).
func (l Lock) XactLock() string { return "pg_advisory_xact_lock(" + l.key + ")" }

// TryXactLock returns the call that takes l exclusively until the transaction ends without
// waiting: true when it got the lock.
func (l Lock) TryXactLock() string { return "pg_try_advisory_xact_lock(" + l.key + ")" }

// Is returns the condition that pg_locks row alias (such as "k") is a hold of, or a wait for, l
// in the current database; alias.granted tells which.
func (l Lock) Is(alias string) string {
	return `(` + alias + `.locktype = 'advisory' and ` + alias + `.objsubid = 1 and ` + alias + `.classid = ((` + l.key + ` >> 32) & 4294967295)::oid and ` +
		alias + `.objid = (` + l.key + ` & 4294967295)::oid and ` + alias + `.database = (select oid from pg_database where datname = current_database()))`
}

// Held returns the condition that some session holds l (shared or exclusive) in the current
// database. pg_locks is read once per statement (an uncorrelated subquery), whatever number of
// rows the condition is evaluated for; the condition is NULL when l's name is NULL.
func (l Lock) Held() string { return l.in(true) }

// Awaited returns the condition that some session waits for l in the current database (read as
// Held reads it).
func (l Lock) Awaited() string { return l.in(false) }

// in returns the condition that l is among the advisory locks of pg_locks whose granted is granted.
func (l Lock) in(granted bool) string {
	g := "granted"
	if !granted {
		g = "not granted"
	}
	return `(((` + l.key + ` >> 32) & 4294967295)::oid, (` + l.key + ` & 4294967295)::oid) in (select classid, objid from pg_locks where locktype = 'advisory' and objsubid = 1 and ` +
		g + ` and database = (select oid from pg_database where datname = current_database()))`
}

// UnlockAll is the call that releases every session-level advisory lock the session holds (the
// run's and the backfill locks of a backfill run's control connection, when the run ends: a
// closed session's locks outlive it until its backend exits).
const UnlockAll = "pg_advisory_unlock_all()"
