package model

import "testing"

func TestAssignSkipsIDsTheContextUses(t *testing.T) {
	var a IDAllocator
	a.SetUsed(func(id string) bool { return id == "call_1" || id == "mine" })
	if got := a.Assign("mine"); got != "call_2" {
		t.Errorf("Assign(mine) with mine in the context = %q, want call_2 (call_1 is used too)", got)
	}
	if got := a.Assign("fresh"); got != "fresh" {
		t.Errorf("Assign(fresh) = %q, want fresh", got)
	}
	if got := a.Assign("fresh"); got != "call_3" {
		t.Errorf("Assign(fresh) again = %q, want call_3", got)
	}
	a.Observe("call_4")
	if got := a.Assign(""); got != "call_5" {
		t.Errorf("Assign() after Observe(call_4) = %q, want call_5", got)
	}
}
