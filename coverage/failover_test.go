package coverage

import (
	"strings"
	"testing"
)

func TestFailoverReadinessWarnings(t *testing.T) {
	ready := StandbyCheck{Standby: "s:5432/postgres", InRecovery: true, SyncReplicationSlots: true, HotStandbyFeedback: true,
		Exists: true, Synced: true, Ready: true}
	for _, c := range []struct {
		name  string
		r     FailoverReadiness
		set   string
		ready bool
		warns []string
	}{
		{"ready", FailoverReadiness{Enabled: true, PhysicalSlots: []PhysicalSlot{{Name: "sb", Active: true}}, StandbyChecks: []StandbyCheck{ready}},
			"sb", true, nil},
		{"not checked on a standby", FailoverReadiness{Enabled: true, PhysicalSlots: []PhysicalSlot{{Name: "sb", Active: true}}},
			"sb", false, nil},
		{"off, nothing set", FailoverReadiness{PhysicalSlots: []PhysicalSlot{}},
			"", false, []string{"is not a failover slot", "no physical replication slot", "synchronized_standby_slots is not set"}},
		{"synchronized slot inactive or unknown", FailoverReadiness{Enabled: true, PhysicalSlots: []PhysicalSlot{{Name: "sb"}}},
			"sb, gone", false, []string{`"sb", named in synchronized_standby_slots, has no standby`, `names "gone", which is no physical slot`}},
		{"standby not ready", FailoverReadiness{Enabled: true, PhysicalSlots: []PhysicalSlot{{Name: "sb", Active: true}},
			StandbyChecks: []StandbyCheck{ready, {Standby: "t", InRecovery: true, HotStandbyFeedback: true, Exists: true, Synced: true, Temporary: true}}},
			"sb", false, []string{"standby t holds slot \"s\" but not ready"}},
		{"standby without feedback, promoted, unreachable", FailoverReadiness{Enabled: true, PhysicalSlots: []PhysicalSlot{{Name: "sb", Active: true}},
			StandbyChecks: []StandbyCheck{{Standby: "a", InRecovery: true}, {Standby: "b"}, {Standby: "c", Error: "refused"}}},
			"sb", false, []string{"standby a has hot_standby_feedback off", "b is not in recovery", "standby c could not be checked: refused"}},
	} {
		r := c.r
		r.Synchronized(c.set)
		r.Assess("s")
		if r.Ready != c.ready || len(r.Warnings) != len(c.warns) {
			t.Errorf("%s: ready %v, warnings %q; want ready %v and %d warnings", c.name, r.Ready, r.Warnings, c.ready, len(c.warns))
			continue
		}
		for i, w := range c.warns {
			if !strings.Contains(r.Warnings[i], w) {
				t.Errorf("%s: warning %d is %q, want it to contain %q", c.name, i, r.Warnings[i], w)
			}
		}
	}
}
