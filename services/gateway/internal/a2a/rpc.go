package a2a

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Request is a JSON-RPC 2.0 request.
type Request struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
}

// Error is a JSON-RPC error object.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("a2a error %d: %s", e.Code, e.Message) }

// Errorf returns a JSON-RPC error.
func Errorf(code int, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Response is a JSON-RPC 2.0 response: Result or Error.
type Response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

// Reply returns the response to id with result or err.
func Reply(id json.RawMessage, result any, err *Error) Response {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	r := Response{JSONRPC: "2.0", ID: id}
	if err != nil {
		r.Error = err
	} else {
		r.Result = result
	}
	return r
}

// Methods of the JSON-RPC binding.
const (
	MethodSendMessage          = "SendMessage"
	MethodSendStreamingMessage = "SendStreamingMessage"
	MethodGetTask              = "GetTask"
	MethodCancelTask           = "CancelTask"
	MethodSubscribeToTask      = "SubscribeToTask"
)

// unsupported are A2A methods Floe knows and does not offer.
var unsupported = map[string]bool{
	"ListTasks": true, "GetExtendedAgentCard": true,
	"CreateTaskPushNotificationConfig": true, "GetTaskPushNotificationConfig": true,
	"ListTaskPushNotificationConfigs": true, "ListTaskPushNotificationConfig": true,
	"DeleteTaskPushNotificationConfig": true,
}

// ParseRequest decodes one JSON-RPC request; the error is the JSON-RPC
// error to answer (parse error, invalid request, method not found,
// unsupported operation), with the request's id when it had one.
func ParseRequest(body []byte) (*Request, *Error) {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		return nil, Errorf(CodeInvalidRequest, "batch requests are not supported")
	}
	var req Request
	if err := json.Unmarshal(body, &req); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) || len(body) == 0 {
			return nil, Errorf(CodeParseError, "parse error: %s", strings.TrimPrefix(err.Error(), "json: "))
		}
		return nil, Errorf(CodeInvalidRequest, "invalid request: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if req.JSONRPC != "2.0" || req.Method == "" {
		return &req, Errorf(CodeInvalidRequest, "invalid request: jsonrpc must be \"2.0\" and method a non-empty string")
	}
	switch req.Method {
	case MethodSendMessage, MethodSendStreamingMessage, MethodGetTask, MethodCancelTask, MethodSubscribeToTask:
		return &req, nil
	}
	if unsupported[req.Method] {
		return &req, Errorf(CodeUnsupported, "%s is not supported by this agent", req.Method)
	}
	return &req, Errorf(CodeMethodNotFound, "method %q not found", req.Method)
}

// SendParams are the params of SendMessage and SendStreamingMessage.
type SendParams struct {
	Message       *Message `json:"message"`
	Configuration *struct {
		ReturnImmediately bool `json:"returnImmediately"`
		HistoryLength     *int `json:"historyLength"`
	} `json:"configuration"`
	Metadata json.RawMessage `json:"metadata"`
}

// TaskParams are the params of GetTask, CancelTask and SubscribeToTask.
type TaskParams struct {
	ID            string `json:"id"`
	HistoryLength *int   `json:"historyLength"`
}

// DecodeParams decodes params into dst; a JSON-RPC invalid-params error
// otherwise.
func DecodeParams(params json.RawMessage, dst any) *Error {
	if len(params) == 0 || bytes.Equal(bytes.TrimSpace(params), []byte("null")) {
		return Errorf(CodeInvalidParams, "params are missing")
	}
	if err := json.Unmarshal(params, dst); err != nil {
		return Errorf(CodeInvalidParams, "invalid params: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// CheckMessage checks a message sent to the agent.
func CheckMessage(m *Message) *Error {
	if m == nil {
		return Errorf(CodeInvalidParams, "params.message is missing")
	}
	if m.MessageID == "" {
		return Errorf(CodeInvalidParams, "message.messageId is missing")
	}
	if m.Role == RoleAgent || m.Role == "agent" {
		return Errorf(CodeInvalidParams, "message.role is %s: messages to the agent are ROLE_USER", m.Role)
	}
	if len(m.Parts) == 0 {
		return Errorf(CodeInvalidParams, "message.parts is empty")
	}
	return nil
}

// Input is one part of a Prompt taken from a message.
type Input struct {
	Text     string
	ImageURL string
}

// Inputs turns a message's parts into a Prompt: text parts as they are,
// data parts as their JSON text, image URLs as images.
func Inputs(m *Message) ([]Input, *Error) {
	var out []Input
	for i, p := range m.Parts {
		switch {
		case p.Text != nil:
			if *p.Text != "" {
				out = append(out, Input{Text: *p.Text})
			}
		case len(p.Data) > 0:
			out = append(out, Input{Text: string(p.Data)})
		case p.URL != "" && strings.HasPrefix(p.MediaType, "image/"):
			out = append(out, Input{ImageURL: p.URL})
		case p.Raw != "" && strings.HasPrefix(p.MediaType, "image/"):
			out = append(out, Input{ImageURL: "data:" + p.MediaType + ";base64," + p.Raw})
		default:
			return nil, Errorf(CodeContentType, "message.parts[%d]: only text, data and image parts are supported", i)
		}
	}
	if len(out) == 0 {
		return nil, Errorf(CodeInvalidParams, "the message holds no text")
	}
	return out, nil
}

// Decision reads an approval answer from a message: a data part
// {"decision": "allow"|"deny"}, or a text part allow or deny.
func Decision(m *Message) (string, *Error) {
	for _, p := range m.Parts {
		if len(p.Data) > 0 {
			var d struct {
				Decision string `json:"decision"`
			}
			if json.Unmarshal(p.Data, &d) == nil && (d.Decision == "allow" || d.Decision == "deny") {
				return d.Decision, nil
			}
		}
		if p.Text != nil {
			switch strings.ToLower(strings.TrimSpace(*p.Text)) {
			case "allow":
				return "allow", nil
			case "deny":
				return "deny", nil
			}
		}
	}
	return "", Errorf(CodeInvalidParams, "the task requires input: answer with a data part {\"decision\": \"allow\"|\"deny\"} or the text allow or deny")
}
