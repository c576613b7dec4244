package grpcretry

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// Metadata keys of the idempotency server interceptor's answers.
const (
	// replayedMetadata is the header metadata key, with the value "true",
	// of an answer the server replayed from its idempotency store instead
	// of running the handler: idempotency.ReplayHeader in lower case (a
	// test holds them equal).
	replayedMetadata = "idempotent-replayed"
	// ReplyOmittedMetadata is the header metadata key, with the value "true",
	// of a replay whose reply message was not kept (it was over the cap,
	// or the store had no room for it): the call ran, once, but its reply
	// cannot be sent again, and the replay is a DATA_LOSS status. For a
	// call that ended with a stored error code, what was not kept is its
	// status (message and details): the replay keeps the code, with a
	// message saying so and no details.
	ReplyOmittedMetadata = "idempotent-reply-omitted"
)

// storedStatusBase is added to a gRPC code to make the Status of the
// store.Record the interceptor stores: OK is 900, NOT_FOUND 905.
// The range is outside HTTP's statuses, so that a gRPC record can never be
// taken for an HTTP answer.
const storedStatusBase = 900

// defaultKeyPushback is the default retry pushback of the idempotency
// interceptor's ABORTED (in progress) and UNAVAILABLE (store unavailable)
// answers; see WithKeyPushback.
const defaultKeyPushback = time.Second

// fingerprintMethod is the method part of a gRPC call's fingerprint; it is
// lower-case, so it is never an HTTP method of the idempotency middleware.
const fingerprintMethod = "grpc"

// Prefixes of the metadata keys in a stored record's Header.
const (
	storedHeader  = "header:"
	storedTrailer = "trailer:"
)

// IdempotencyUnaryServerInterceptor returns a unary server interceptor
// that runs each call carrying an idempotency key (metadata key "idempotency-key",
// idempotency.Header in lower case, validated as idempotency.ParseKey validates the HTTP
// header) at most once per key, through g, the idempotency package's
// protocol-neutral core, on any idempotency store (memory, PostgreSQL,
// Redis): the gRPC twin of idempotency.NewMiddleware. Install it after
// authentication (its scope function reads the caller from the context).
//
// The key is scoped to the caller ([WithKeyScope]); the call's fingerprint
// is its full method name and a SHA-256 hash of its request message,
// marshaled deterministically. The first call with a key runs the handler
// while g keeps the key locked, and its answer is stored: the code, as
// the record's Status (900 + code); the reply message,
// marshaled deterministically, or for an error its google.rpc.Status
// (message and details); the allow-listed header and trailer metadata
// ([WithReplayMetadata]) the handler set, as a caller would get it (header
// metadata set after the handler sent the header is not), even when its
// own caller had left and gRPC refused to send it. Answers with other
// codes than [WithStoredCodes]'s release the key. Other calls with the
// key get:
//
//	first call finished           its answer again: the reply (unmarshaled
//	                              into the method's reply type) or the
//	                              status, its allow-listed metadata, and
//	                              the header "idempotent-replayed: true"
//	  reply over the cap or       DATA_LOSS, with "idempotent-reply-omitted:
//	  no room for it              true" (the call ran once)
//	first call still runs         ABORTED, trailer grpc-retry-pushback-ms
//	                              ([WithKeyPushback]); this package's client
//	                              retries a keyed ABORTED with a pushback
//	same key, other method or     FAILED_PRECONDITION, with a
//	  request message               google.rpc.PreconditionFailure
//	key malformed, two values,    INVALID_ARGUMENT, with a
//	  or required and missing       google.rpc.BadRequest
//	store unavailable             UNAVAILABLE with the pushback: the
//	                              handler does not run (fail closed)
//	caller unknown, request not   INTERNAL: the handler does not run
//	  a proto message, reply
//	  type not registered
//
// A reused key is FAILED_PRECONDITION rather than INVALID_ARGUMENT because
// the call itself is well formed: what refuses it is the state of the
// server (the key is bound to another call), and like HTTP's 422 it must
// not be retried as is; ALREADY_EXISTS would read as the handler's own
// answer.
//
// Streaming calls are not guarded (a unary interceptor does not see
// them). Which unary methods are is an option ([WithKeyMethods]; all by
// default); a call without a key runs unguarded unless [WithKeyRequired].
// Every call is reported to g's observer (idempotency.WithObserver), the
// refusals above as "invalid". It fails, with an error that says why,
// when g is nil, an option is invalid, no scope is set
// ([WithKeyScope]; it says how to share one scope between all callers,
// deliberately), or a method of
// [WithKeyMethods] has no registered reply type.
func IdempotencyUnaryServerInterceptor(g *idempotency.Guard, opts ...IdempotencyOption) (grpc.UnaryServerInterceptor, error) {
	if g == nil {
		return nil, invalid("nil idempotency guard")
	}
	s := &idemServer{g: g, cfg: idemConfig{
		stored:   defaultStoredCode,
		maxReply: defaultMaxStoredReply,
		pushback: defaultKeyPushback,
	}}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.applyIdem(&s.cfg); err != nil {
			return nil, err
		}
	}
	if s.cfg.scope == nil {
		return nil, invalid("no key scope: pass WithKeyScope (map each call to its caller, or deliberately every call to one constant)")
	}
	for m := range s.cfg.methods {
		if _, err := s.replyType(m); err != nil {
			return nil, fmt.Errorf("grpcretry: invalid option: WithKeyMethods: %w", err)
		}
	}
	return s.intercept, nil
}

// idemServer is the state of one idempotency interceptor.
type idemServer struct {
	g     *idempotency.Guard
	cfg   idemConfig
	types sync.Map // full method -> protoreflect.MessageType of its reply
}

// deterministic marshals messages the same way every time (map entries
// sorted), so that equal messages have equal fingerprints and records.
var deterministic = proto.MarshalOptions{Deterministic: true}

func (s *idemServer) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.cfg.methods != nil && !s.cfg.methods[info.FullMethod] {
		return handler(ctx, req)
	}
	raw, err := callKey(ctx)
	switch {
	case err != nil:
		s.g.ReportInvalid(ctx)
		return nil, badKey(err.Error())
	case raw == "" && s.cfg.required:
		s.g.ReportInvalid(ctx)
		return nil, badKey("this method needs an idempotency key: send it in the " + keyMetadata + " metadata")
	case raw == "":
		return handler(ctx, req)
	}
	scope, err := s.cfg.scope(ctx)
	if err == nil && scope == "" {
		err = errors.New("empty scope")
	}
	if err != nil {
		s.g.ReportInvalid(ctx)
		return nil, status.Error(codes.Internal, "idempotency: the caller of this call could not be identified; it was not processed")
	}
	fp, mt, err := s.fingerprint(info.FullMethod, req)
	if err != nil {
		s.g.ReportInvalid(ctx)
		return nil, status.Error(codes.Internal, "idempotency: "+err.Error()+"; the call was not processed")
	}
	var (
		reply any
		herr  error
	)
	outcome, rec, err := s.g.Run(ctx, scope, raw, fp, func(ctx context.Context) (store.Record, bool) {
		var rec store.Record
		var keep bool
		reply, rec, keep, herr = s.handle(ctx, req, handler)
		return rec, keep
	})
	switch {
	case errors.Is(err, idempotency.ErrStoreUnavailable):
		_ = grpc.SetTrailer(ctx, pushbackMD(s.cfg.pushback))
		return nil, status.Error(codes.Unavailable, "idempotency: store unavailable; the call was not processed: retry it with the same idempotency key")
	case err != nil && ctx.Err() != nil: // gone while the key was claimed
		return nil, status.FromContextError(ctx.Err()).Err()
	case err != nil:
		return nil, status.Error(codes.Internal, err.Error())
	case outcome == store.Mismatch:
		return nil, withDetails(status.New(codes.FailedPrecondition, "idempotency: this idempotency key was used for a different call (method or request message)"),
			&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
				Type: "IDEMPOTENCY_KEY_REUSED", Subject: keyMetadata,
				Description: "the key is bound to another call; send a new key for a new call",
			}}})
	case outcome == store.InProgress:
		_ = grpc.SetTrailer(ctx, pushbackMD(s.cfg.pushback))
		return nil, status.Error(codes.Aborted, "idempotency: a call with this idempotency key is still being processed; retry it later with the same key")
	case outcome == store.Completed:
		return s.replay(ctx, mt, rec)
	}
	return reply, herr
}

// callKey returns the raw idempotency key of the server call of ctx, ""
// if it has none. More than one value, or a malformed one, is an error.
func callKey(ctx context.Context) (string, error) {
	vs := metadata.ValueFromIncomingContext(ctx, keyMetadata)
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
		return idempotency.ParseKey(vs[0])
	}
	return "", fmt.Errorf("%d %s values: send exactly one", len(vs), keyMetadata)
}

// badKey returns the INVALID_ARGUMENT error of a call whose key is bad or
// missing.
func badKey(why string) error {
	return withDetails(status.New(codes.InvalidArgument, "idempotency: "+why),
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field: keyMetadata, Description: why,
		}}})
}

// withDetails returns st with details as an error (st alone if they
// cannot be added).
func withDetails(st *status.Status, details ...protoadapt.MessageV1) error {
	if d, err := st.WithDetails(details...); err == nil {
		st = d
	}
	return st.Err()
}

// fingerprint returns the fingerprint of a call of method with req, and
// the type of the method's reply.
func (s *idemServer) fingerprint(method string, req any) (store.Fingerprint, protoreflect.MessageType, error) {
	mt, err := s.replyType(method)
	if err != nil {
		return store.Fingerprint{}, nil, err
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return store.Fingerprint{}, nil, fmt.Errorf("request of %s is a %T, not a proto message", method, req)
	}
	b, err := deterministic.Marshal(msg)
	if err != nil {
		return store.Fingerprint{}, nil, fmt.Errorf("request of %s cannot be marshaled: %w", method, err)
	}
	return store.NewFingerprint(fingerprintMethod, method, sha256.Sum256(b)), mt, nil
}

// replyType returns the type of method's reply message, from the global
// registries (cached).
func (s *idemServer) replyType(method string) (protoreflect.MessageType, error) {
	if t, ok := s.types.Load(method); ok {
		return t.(protoreflect.MessageType), nil
	}
	i := strings.LastIndexByte(method, '/')
	if len(method) < 4 || method[0] != '/' || i <= 1 || i == len(method)-1 {
		return nil, fmt.Errorf("method %q is not a full method name (/package.Service/Method)", method)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(method[1:i]))
	if err != nil {
		return nil, fmt.Errorf("service of %s not registered: %w", method, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("%s is not a service", method[1:i])
	}
	md := sd.Methods().ByName(protoreflect.Name(method[i+1:]))
	if md == nil {
		return nil, fmt.Errorf("method %s not found in its service", method)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil, fmt.Errorf("reply type %s of %s not registered: %w", md.Output().FullName(), method, err)
	}
	s.types.Store(method, mt)
	return mt, nil
}

// handle runs the handler on the Guard's context ctx, capturing the
// allow-listed metadata it sets, and returns its answer, the record of it
// and whether to store it.
func (s *idemServer) handle(ctx context.Context, req any, handler grpc.UnaryHandler) (reply any, rec store.Record, keep bool, err error) {
	var c *capture
	if len(s.cfg.replay) > 0 {
		if sts := grpc.ServerTransportStreamFromContext(ctx); sts != nil {
			c = &capture{ServerTransportStream: sts, allow: s.cfg.replay}
			ctx = grpc.NewContextWithServerTransportStream(ctx, c)
		}
	}
	reply, err = handler(ctx, req)
	// The status the caller gets, as grpc-go's server makes it: OK for nil;
	// a context error without a status is CANCELED or DEADLINE_EXCEEDED
	// (a handler's "return nil, ctx.Err()"), any other UNKNOWN.
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	if !s.cfg.stored(st.Code()) {
		return reply, store.Record{}, false, err
	}
	var body []byte
	var merr error
	if err == nil {
		msg, ok := reply.(proto.Message)
		if !ok {
			return reply, store.Record{}, false, err // grpc's codec cannot send it either
		}
		body, merr = deterministic.Marshal(msg)
	} else {
		body, merr = deterministic.Marshal(st.Proto())
	}
	if merr != nil {
		return reply, store.Record{}, false, err
	}
	rec = store.Record{Status: storedStatusBase + int(st.Code()), Body: body}
	if c != nil {
		rec.Header = c.stored()
	}
	if len(body) > s.cfg.maxReply {
		rec.Body, rec.BodyOmitted = nil, true
	}
	return reply, rec, true, err
}

// replay answers a call from the stored record rec; mt is the method's
// reply type.
func (s *idemServer) replay(ctx context.Context, mt protoreflect.MessageType, rec store.Record) (any, error) {
	header := metadata.Pairs(replayedMetadata, "true")
	var trailer metadata.MD
	for name, vs := range rec.Header {
		switch {
		case strings.HasPrefix(name, storedHeader):
			header[name[len(storedHeader):]] = slices.Clone(vs)
		case strings.HasPrefix(name, storedTrailer):
			if trailer == nil {
				trailer = metadata.MD{}
			}
			trailer[name[len(storedTrailer):]] = slices.Clone(vs)
		}
	}
	if rec.BodyOmitted {
		header.Set(ReplyOmittedMetadata, "true")
	}
	_ = grpc.SetHeader(ctx, header)
	if len(trailer) > 0 {
		_ = grpc.SetTrailer(ctx, trailer)
	}
	code := codes.Code(rec.Status - storedStatusBase)
	if rec.Status < storedStatusBase || code > codes.Unauthenticated {
		return nil, status.Errorf(codes.DataLoss, "idempotency: the stored answer of this key is not a gRPC answer (status %d)", rec.Status)
	}
	switch {
	case code == codes.OK && rec.BodyOmitted:
		return nil, status.Error(codes.DataLoss, "idempotency: this call ran once, but its reply was not kept (over the size cap, or no room in the store) and cannot be sent again")
	case code == codes.OK:
		reply := mt.New().Interface()
		if err := proto.Unmarshal(rec.Body, reply); err != nil {
			return nil, status.Errorf(codes.DataLoss, "idempotency: the stored reply of this key cannot be read: %v", err)
		}
		return reply, nil
	case rec.BodyOmitted:
		return nil, status.Error(code, "idempotency: replayed status (its message was not kept)")
	}
	var sp spb.Status
	if err := proto.Unmarshal(rec.Body, &sp); err != nil || codes.Code(sp.GetCode()) != code {
		return nil, status.Errorf(codes.DataLoss, "idempotency: the stored status of this key cannot be read")
	}
	return nil, status.ErrorProto(&sp)
}

// capture is the server transport stream a guarded handler runs with: it
// passes every call through, returning the wrapped stream's answer, and
// keeps the allow-listed keys of the header and trailer metadata the
// handler set, for the record. It keeps them whatever the wrapped stream
// answers (grpc-go refuses every write once the caller has left, and the
// record is what the handler produced, for the callers to come), but
// follows gRPC's rule of one header: header metadata set or sent after
// the handler sent the header is not kept, as no caller would get it.
type capture struct {
	grpc.ServerTransportStream
	allow []string

	mu sync.Mutex
	// Fields below are guarded by mu.
	header, trailer metadata.MD
	sent            bool // SendHeader was called
}

func (c *capture) SetHeader(md metadata.MD) error {
	err := c.ServerTransportStream.SetHeader(md)
	c.keep(&c.header, md, false)
	return err
}

func (c *capture) SendHeader(md metadata.MD) error {
	err := c.ServerTransportStream.SendHeader(md)
	c.keep(&c.header, md, true)
	return err
}

func (c *capture) SetTrailer(md metadata.MD) error {
	err := c.ServerTransportStream.SetTrailer(md)
	c.keep(&c.trailer, md, false)
	return err
}

// keep adds the allow-listed keys of md to *dst (c.header or c.trailer),
// but header metadata once the header was sent; send: md is sent with the
// header (SendHeader), which later header metadata cannot join.
func (c *capture) keep(dst *metadata.MD, md metadata.MD, send bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if dst == &c.header {
		if c.sent {
			return
		}
		c.sent = send
	}
	for k, vs := range md {
		k = strings.ToLower(k)
		if !slices.Contains(c.allow, k) {
			continue
		}
		if *dst == nil {
			*dst = metadata.MD{}
		}
		(*dst)[k] = append((*dst)[k], vs...)
	}
}

// stored returns the kept metadata as a record's Header, nil if none.
func (c *capture) stored() http.Header {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.header)+len(c.trailer) == 0 {
		return nil
	}
	h := make(http.Header, len(c.header)+len(c.trailer))
	for k, vs := range c.header {
		h[storedHeader+k] = slices.Clone(vs)
	}
	for k, vs := range c.trailer {
		h[storedTrailer+k] = slices.Clone(vs)
	}
	return h
}
