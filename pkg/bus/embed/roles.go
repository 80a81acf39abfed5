package embed

import "github.com/nats-io/nats-server/v2/server"

// tracerDurable is the tracer's durable consumer, which the engine's and
// the gateway's consumer permissions on FLOE_SESSIONS would otherwise
// cover: neither may delete it, re-create it or pull from it. The
// unnamed create (the legacy ephemeral endpoint) takes the consumer's
// name from the request body, so a "name": "floe-tracer" there
// re-configured the durable (its filter replaced): neither role may use
// it (the jetstream package always names its consumers).
var tracerDurable = []string{
	"$JS.API.CONSUMER.CREATE.FLOE_SESSIONS",
	"$JS.API.CONSUMER.CREATE.FLOE_SESSIONS.floe-tracer",
	"$JS.API.CONSUMER.CREATE.FLOE_SESSIONS.floe-tracer.>",
	"$JS.API.CONSUMER.DELETE.FLOE_SESSIONS.floe-tracer",
	"$JS.API.CONSUMER.MSG.NEXT.FLOE_SESSIONS.floe-tracer",
	"$JS.API.CONSUMER.RESET.FLOE_SESSIONS.floe-tracer",
}

// rolePermissions returns the permissions of user, as deploy/nats/auth.conf
// writes them (TestRolesMatchDeployAuthConf keeps the two equal); nil for
// admin, who may do anything.
func rolePermissions(user string) *server.Permissions {
	responses := &server.ResponsePermission{MaxMsgs: server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS, Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
	allow := func(pub, sub []string) *server.Permissions {
		return &server.Permissions{Publish: &server.SubjectPermission{Allow: pub}, Subscribe: &server.SubjectPermission{Allow: sub}}
	}
	switch user {
	case UserEngine:
		p := allow([]string{
			"floe.session.*.*",
			"floe.tool.>",
			"floe.task.>",
			"floe.toollist.*",
			"floe.cancel.*",
			"floe.ctl.*.*",
			"floe.hook.*",
			"$KV.floe_sessions.>",
			"$JS.API.STREAM.INFO.KV_floe_sessions",
			"$JS.API.DIRECT.GET.KV_floe_sessions.>",
			"$JS.API.STREAM.MSG.GET.KV_floe_sessions",
			"$KV.floe_snapshots.>",
			"$JS.API.STREAM.INFO.KV_floe_snapshots",
			"$JS.API.DIRECT.GET.KV_floe_snapshots.>",
			"$JS.API.STREAM.MSG.GET.KV_floe_snapshots",
			"$JS.API.CONSUMER.CREATE.FLOE_TASKS.>",
			"$JS.API.CONSUMER.INFO.FLOE_TASKS.*",
			"$JS.API.CONSUMER.MSG.NEXT.FLOE_TASKS.*",
			"$JS.ACK.FLOE_TASKS.>",
			"$JS.API.STREAM.INFO.FLOE_SESSIONS",
			"$JS.API.CONSUMER.CREATE.FLOE_SESSIONS.>",
			"$JS.API.CONSUMER.INFO.FLOE_SESSIONS.*",
			"$JS.API.CONSUMER.DELETE.FLOE_SESSIONS.*",
			"$JS.API.CONSUMER.MSG.NEXT.FLOE_SESSIONS.*",
			"$JS.API.DIRECT.GET.FLOE_SESSIONS",
			"$JS.API.STREAM.MSG.GET.FLOE_SESSIONS",
			"$JS.API.STREAM.PURGE.FLOE_SESSIONS",
			"$JS.API.STREAM.INFO.FLOE_TOOLS",
			"$JS.API.STREAM.MSG.DELETE.FLOE_TOOLS",
			"$JS.API.STREAM.MSG.GET.FLOE_TOOLS",
		}, []string{"floe.ctl.*.*", "floe.hb.*", "_INBOX.engine.>", "$SRV.>", "floe.status.engine"})
		p.Publish.Deny = tracerDurable
		p.Response = responses
		return p
	case UserToolrunner:
		p := allow([]string{
			"floe.session.*.partial",
			"floe.session.*.model",
			"floe.hb.*",
			// read back an output segment the stream lost part of
			"$JS.API.DIRECT.GET.FLOE_SESSIONS",
			"$JS.API.STREAM.INFO.KV_floe_sessions",
			"$JS.API.CONSUMER.CREATE.FLOE_TOOLS.>",
			"$JS.API.CONSUMER.INFO.FLOE_TOOLS.*",
			"$JS.API.CONSUMER.MSG.NEXT.FLOE_TOOLS.*",
			"$JS.ACK.FLOE_TOOLS.>",
			// per-path file locks (protocol.md §7)
			"$KV.floe_locks.>",
			"$JS.API.STREAM.INFO.KV_floe_locks",
			"$JS.API.DIRECT.GET.KV_floe_locks.>",
			"$JS.API.STREAM.MSG.GET.KV_floe_locks",
		}, []string{"floe.cancel.*", "floe.toollist.*", "_INBOX.toolrunner.>", "$SRV.>", "floe.status.toolrunner"})
		p.Response = responses
		return p
	case UserTracer:
		p := allow([]string{
			"$JS.API.STREAM.INFO.FLOE_SESSIONS",
			"$JS.API.STREAM.INFO.KV_floe_sessions",
			"$JS.API.DIRECT.GET.FLOE_SESSIONS",
			"$JS.API.STREAM.MSG.GET.FLOE_SESSIONS",
			"$JS.API.CONSUMER.CREATE.FLOE_SESSIONS.floe-tracer",
			"$JS.API.CONSUMER.CREATE.FLOE_SESSIONS.floe-tracer.>",
			"$JS.API.CONSUMER.INFO.FLOE_SESSIONS.floe-tracer",
			"$JS.API.CONSUMER.DELETE.FLOE_SESSIONS.floe-tracer",
			"$JS.API.CONSUMER.RESET.FLOE_SESSIONS.floe-tracer",
			"$JS.API.CONSUMER.MSG.NEXT.FLOE_SESSIONS.floe-tracer",
			"$JS.ACK.FLOE_SESSIONS.floe-tracer.>",
			"$JS.API.STREAM.PURGE.FLOE_SESSIONS",
		}, []string{"floe.tracer.delete.*", "_INBOX.tracer.>", "$SRV.>", "floe.status.tracer"})
		p.Response = responses
		return p
	case UserGateway:
		p := allow([]string{
			"floe.task.*",
			"floe.ctl.*.*",
			"floe.toollist.*",
			"floe.tracer.delete.*",
			"floe.toollist.*",
			"floe.session.*.server",
			"$KV.floe_sessions.>",
			"$JS.API.STREAM.INFO.KV_floe_sessions",
			"$JS.API.DIRECT.GET.KV_floe_sessions.>",
			"$JS.API.STREAM.MSG.GET.KV_floe_sessions",
			"$JS.API.CONSUMER.CREATE.KV_floe_sessions",
			"$JS.API.CONSUMER.CREATE.KV_floe_sessions.>",
			"$JS.API.CONSUMER.INFO.KV_floe_sessions.*",
			"$JS.API.CONSUMER.DELETE.KV_floe_sessions.*",
			"$JS.API.CONSUMER.MSG.NEXT.KV_floe_sessions.*",
			"$JS.FC.KV_floe_sessions.>",
			"$KV.floe_snapshots.>",
			"$JS.API.STREAM.INFO.KV_floe_snapshots",
			"$KV.floe_signins.>",
			"$JS.API.STREAM.INFO.KV_floe_signins",
			"$JS.API.DIRECT.GET.KV_floe_signins.>",
			"$JS.API.STREAM.MSG.GET.KV_floe_signins",
			"$KV.floe_protocols.>",
			"$JS.API.STREAM.INFO.KV_floe_protocols",
			"$JS.API.DIRECT.GET.KV_floe_protocols.>",
			"$JS.API.STREAM.MSG.GET.KV_floe_protocols",
			"$JS.API.STREAM.INFO.FLOE_SESSIONS",
			"$JS.API.CONSUMER.CREATE.FLOE_SESSIONS.>",
			"$JS.API.CONSUMER.INFO.FLOE_SESSIONS.*",
			"$JS.API.CONSUMER.DELETE.FLOE_SESSIONS.*",
			"$JS.API.CONSUMER.MSG.NEXT.FLOE_SESSIONS.*",
			"$JS.API.DIRECT.GET.FLOE_SESSIONS",
			"$JS.API.DIRECT.GET.FLOE_SESSIONS.>",
			"$JS.API.STREAM.MSG.GET.FLOE_SESSIONS",
			"$JS.API.STREAM.INFO.FLOE_TASKS",
			"$JS.API.STREAM.PURGE.FLOE_TASKS",
		}, []string{"_INBOX.gateway.>", "$SRV.>", "floe.status.gateway"})
		p.Publish.Deny = tracerDurable
		p.Response = responses
		return p
	case UserOps:
		return &server.Permissions{
			Publish: &server.SubjectPermission{
				Allow: []string{
					"$JS.API.INFO",
					"$JS.API.STREAM.NAMES",
					"$JS.API.STREAM.LIST",
					"$JS.API.STREAM.INFO.*",
					"$JS.API.CONSUMER.NAMES.*",
					"$JS.API.CONSUMER.LIST.*",
					"$JS.API.CONSUMER.INFO.*.*",
					"$JS.API.CONSUMER.CREATE.FLOE_SESSIONS",
					"$JS.API.CONSUMER.CREATE.FLOE_SESSIONS.>",
					"$JS.API.CONSUMER.CREATE.KV_floe_sessions",
					"$JS.API.CONSUMER.CREATE.KV_floe_sessions.>",
					"$JS.API.CONSUMER.MSG.NEXT.FLOE_SESSIONS.*",
					"$JS.API.CONSUMER.MSG.NEXT.KV_floe_sessions.*",
					"$JS.API.CONSUMER.DELETE.KV_floe_sessions.*",
					"$JS.API.DIRECT.GET.>",
					"$JS.API.STREAM.MSG.GET.*",
					"$JS.FC.>",
					"$SRV.>",
					"floe.status.>",
				},
				Deny: []string{
					"$JS.API.CONSUMER.CREATE.FLOE_SESSIONS.floe-tracer",
					"$JS.API.CONSUMER.CREATE.FLOE_SESSIONS.floe-tracer.>",
					"$JS.API.CONSUMER.MSG.NEXT.FLOE_SESSIONS.floe-tracer",
				},
			},
			Subscribe: &server.SubjectPermission{
				Allow: []string{"_INBOX.>"},
				Deny:  []string{"_INBOX.engine.>", "_INBOX.toolrunner.>", "_INBOX.tracer.>", "_INBOX.gateway.>"},
			},
		}
	case UserHook:
		// It answers the engine's hook requests and publishes nothing
		// else: replies only (allow_responses).
		p := &server.Permissions{
			Publish:   &server.SubjectPermission{Deny: []string{">"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"floe.hook.*", "$SRV.>"}},
		}
		p.Response = responses
		return p
	}
	return nil
}
