// Package console is a web console for leasestore queues: an http.Handler
// that shows queue depth, dead letters grouped by error, messages by
// filter, one message's payload and history, the ordering keys in use and
// the doctor report, depth and throughput sampled over the last hour while
// Run runs, and requeues,
// dead-letters or purges one message or every message a filter matches.
//
// Server-rendered (html/template, no JavaScript needed). Mount it behind
// the application's own authentication: the handler authenticates no one.
// Every mutating request is a POST that carries the CSRF token of the
// page's cookie, follows a confirmation page, goes through the library's
// fenced calls (leasing.Postgres Requeue, DeadLetterByID, Bulk) and writes
// one audit line to Options.Logger. With Options.ReadOnly every mutating
// request is refused (403).
package console

import (
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/internal/doctor"
	"github.com/leasestore/leasestore/leasing"
)

//go:embed templates/*.html
var templateFS embed.FS

// Options configures the console.
type Options struct {
	// ReadOnly refuses every mutating request with 403 and hides the
	// action buttons.
	ReadOnly bool
	// Logger receives one audit line per action (level INFO, message
	// "console action"); nil logs to slog.Default().
	Logger *slog.Logger
	// User names the operator of a request in audit lines (e.g. from the
	// application's authentication); nil logs the remote address only.
	User func(*http.Request) string
	// PageSize is the messages per list page; 0 means 50.
	PageSize int
	// SampleEvery is how often Run samples each queue's Stats for the
	// queues page's depth and throughput of the last hour; 0 means 30 s,
	// below 100 ms means 100 ms, negative turns the sampling off.
	SampleEvery time.Duration
}

// Console is the console's http.Handler.
type Console struct {
	stores map[leasing.Queue]*leasing.Postgres
	queues []leasing.Queue
	opts   Options
	tmpl   *template.Template
	mux    *http.ServeMux
	// sampler is the queues' history; Run fills it.
	sampler sampler
}

// csrfCookie holds the double-submit CSRF token.
const csrfCookie = "leasestore_console_csrf"

// New returns a console over stores, one per queue. It serves at once;
// the queues page's history of the last hour fills while Run runs (stop it
// with Close).
//
// Errors: none of stores, or two of one queue.
func New(opts Options, stores ...*leasing.Postgres) (*Console, error) {
	if len(stores) == 0 {
		return nil, errors.New("console: no store given")
	}
	c := &Console{stores: map[leasing.Queue]*leasing.Postgres{}, opts: opts}
	for _, s := range stores {
		if _, dup := c.stores[s.Queue()]; dup {
			return nil, fmt.Errorf("console: two stores of queue %s", s.Queue())
		}
		c.stores[s.Queue()] = s
		c.queues = append(c.queues, s.Queue())
	}
	if c.opts.Logger == nil {
		c.opts.Logger = slog.Default()
	}
	if c.opts.PageSize <= 0 {
		c.opts.PageSize = 50
	}
	c.sampler.every = c.opts.SampleEvery
	switch {
	case c.sampler.every == 0:
		c.sampler.every = defaultSampleEvery
	case c.sampler.every > 0 && c.sampler.every < minSampleEvery:
		c.sampler.every = minSampleEvery
	}
	c.sampler.hist = map[leasing.Queue]*history{}
	for _, q := range c.queues {
		c.sampler.hist[q] = newHistory(max(c.sampler.every, minSampleEvery))
	}
	c.tmpl = template.Must(template.New("").Funcs(template.FuncMap{
		"stamp": func(t any) string {
			switch v := t.(type) {
			case time.Time:
				return v.UTC().Format("2006-01-02 15:04:05.000Z")
			case *time.Time:
				if v == nil {
					return "-"
				}
				return v.UTC().Format("2006-01-02 15:04:05.000Z")
			}
			return ""
		},
		"short": func(s string, n int) string {
			if len([]rune(s)) <= n {
				return s
			}
			return string([]rune(s)[:n]) + "…"
		},
	}).ParseFS(templateFS, "templates/*.html"))
	c.mux = http.NewServeMux()
	c.mux.HandleFunc("GET /{$}", c.queuesPage)
	c.mux.HandleFunc("GET /dead-letters", c.deadLettersPage)
	c.mux.HandleFunc("GET /messages", c.messagesPage)
	c.mux.HandleFunc("GET /messages/{queue}/{id}", c.messagePage)
	c.mux.HandleFunc("GET /keys", c.keysPage)
	c.mux.HandleFunc("GET /doctor", c.doctorPage)
	c.mux.HandleFunc("GET /confirm", c.confirmPage)
	c.mux.HandleFunc("POST /act", c.act)
	return c, nil
}

// ServeHTTP implements http.Handler. Mount it with http.StripPrefix when it
// is not at the root: its links are relative to the mount point.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodGet && r.Method != http.MethodHead && c.opts.ReadOnly {
		http.Error(w, "the console is read-only", http.StatusForbidden)
		return
	}
	c.mux.ServeHTTP(w, r)
}

// page is what every template gets.
type page struct {
	// Root is the relative path from the page to the console's root.
	Root     string
	Title    string
	Queues   []leasing.Queue
	ReadOnly bool
	CSRF     string
	Data     any
}

// render writes template name with data, the CSRF cookie set.
func (c *Console) render(w http.ResponseWriter, r *http.Request, name, title string, data any) {
	token := csrfToken(w, r)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := c.tmpl.ExecuteTemplate(w, name, page{Root: rootOf(r.URL.Path), Title: title, Queues: c.queues, ReadOnly: c.opts.ReadOnly, CSRF: token, Data: data}); err != nil {
		c.opts.Logger.Error("console: render", "page", name, "error", err)
	}
}

// rootOf returns the relative path from the page at path to the root:
// "./" for /messages, "../../" for /messages/inbox/<id>.
func rootOf(path string) string {
	depth := strings.Count(strings.TrimPrefix(path, "/"), "/")
	if depth == 0 {
		return "./"
	}
	return strings.Repeat("../", depth)
}

// csrfToken returns the request's CSRF cookie, setting a new one when it
// has none.
func csrfToken(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 32 {
		return ck.Value
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	return token
}

// fail writes an error page with status code.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, code int, err error) {
	w.WriteHeader(code)
	c.render(w, r, "error", "Error", err.Error())
}

// store returns the store of the queue named s.
func (c *Console) store(s string) (*leasing.Postgres, error) {
	q, err := leasing.ParseQueue(s)
	if err != nil {
		return nil, err
	}
	st, ok := c.stores[q]
	if !ok {
		return nil, fmt.Errorf("queue %s is not served here", q)
	}
	return st, nil
}

// queueRow is one queue on the queues page.
type queueRow struct {
	Stats    leasing.Stats
	Statuses []statusCount
	// History is the sampled depth and throughput; nil before Run's first
	// sample or with sampling off.
	History *historyView
}

type statusCount struct {
	Status leasing.Status
	Count  int64
}

func (c *Console) queuesPage(w http.ResponseWriter, r *http.Request) {
	var rows []queueRow
	for _, q := range c.queues {
		st, err := c.stores[q].Stats(r.Context())
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, err)
			return
		}
		row := queueRow{Stats: st, History: c.historyOf(q)}
		for _, s := range q.Statuses() {
			row.Statuses = append(row.Statuses, statusCount{s, st.Depth[s]})
		}
		rows = append(rows, row)
	}
	c.render(w, r, "queues", "Queues", rows)
}

type deadLetterData struct {
	Queue  leasing.Queue
	Groups []leasing.DeadLetterGroup
}

func (c *Console) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	var data []deadLetterData
	for _, q := range c.queues {
		if name := r.URL.Query().Get("queue"); name != "" && name != string(q) {
			continue
		}
		groups, err := c.stores[q].DeadLetterGroups(r.Context(), 100)
		if err != nil {
			c.fail(w, r, http.StatusInternalServerError, err)
			return
		}
		data = append(data, deadLetterData{Queue: q, Groups: groups})
	}
	c.render(w, r, "deadletters", "Dead letters", data)
}

// filterForm is a list filter as the forms and links carry it.
type keysData struct {
	Queue leasing.Queue
	Lines []leasing.KeyLine
}

// keysPage lists each queue's ordering keys in use, the longest-held first.
func (c *Console) keysPage(w http.ResponseWriter, r *http.Request) {
	var data []keysData
	for _, q := range c.queues {
		lines, err := c.stores[q].KeyLines(r.Context(), 100)
		if err != nil {
			c.fail(w, r, statusOf(err), err)
			return
		}
		data = append(data, keysData{Queue: q, Lines: lines})
	}
	c.render(w, r, "keys", "Ordering keys", data)
}

// doctorPage runs leasectl doctor's checks on the queues served and shows
// its text report.
func (c *Console) doctorPage(w http.ResponseWriter, r *http.Request) {
	rep, err := doctor.Check(r.Context(), c.stores[c.queues[0]].Pool(), doctor.Options{Queues: c.queues})
	if err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	var text strings.Builder
	if err := doctor.WriteText(&text, rep); err != nil {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	c.render(w, r, "doctor", "Doctor", struct {
		OK   bool
		Text string
	}{rep.OK, text.String()})
}

type filterForm struct {
	Queue                                                                      string
	Status, Type, Tenant, OrderingKey, IdempotencyKey, Topic, Error, OlderThan string
}

func filterOf(v url.Values) filterForm {
	return filterForm{
		Queue: v.Get("queue"), Status: v.Get("status"), Type: v.Get("type"), Tenant: v.Get("tenant"),
		OrderingKey: v.Get("ordering_key"), IdempotencyKey: v.Get("idempotency_key"), Topic: v.Get("topic"),
		Error: v.Get("error"), OlderThan: v.Get("older_than"),
	}
}

// Values returns f as query parameters, empty ones left out.
func (f filterForm) Values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{
		"queue": f.Queue, "status": f.Status, "type": f.Type, "tenant": f.Tenant, "ordering_key": f.OrderingKey,
		"idempotency_key": f.IdempotencyKey, "topic": f.Topic, "error": f.Error, "older_than": f.OlderThan,
	} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// Query is f as a query string.
func (f filterForm) Query() string { return f.Values().Encode() }

// filter returns f as the library's filter for f's queue.
func (f filterForm) filter() (leasing.ListFilter, error) {
	lf := leasing.ListFilter{
		Status: leasing.Status(f.Status), Type: f.Type, TenantID: f.Tenant, OrderingKey: f.OrderingKey,
		IdempotencyKey: f.IdempotencyKey, Topic: f.Topic, ErrorContains: f.Error,
	}
	if f.OlderThan != "" {
		d, err := ParseDuration(f.OlderThan)
		if err != nil {
			return lf, fmt.Errorf("older than: %w", err)
		}
		lf.OlderThan = d
	}
	return lf, nil
}

type messagesData struct {
	Filter   filterForm
	Statuses []leasing.Status
	Rows     []leasing.Row
	Next     string
}

func (c *Console) messagesPage(w http.ResponseWriter, r *http.Request) {
	f := filterOf(r.URL.Query())
	if f.Queue == "" {
		f.Queue = string(c.queues[0])
	}
	s, err := c.store(f.Queue)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	lf, err := f.filter()
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	after, err := leasing.ParseCursor(r.URL.Query().Get("after"))
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	p, err := s.List(r.Context(), leasing.ListRequest{Filter: lf, After: after, Limit: c.opts.PageSize})
	if err != nil {
		c.fail(w, r, statusOf(err), err)
		return
	}
	c.render(w, r, "messages", "Messages", messagesData{Filter: f, Statuses: s.Queue().Statuses(), Rows: p.Rows, Next: p.Next.String()})
}

type messageData struct {
	Queue       leasing.Queue
	Row         leasing.Row
	PayloadKind PayloadKind
	Payload     string
	Headers     string
	TraceID     string
}

func (c *Console) messagePage(w http.ResponseWriter, r *http.Request) {
	s, err := c.store(r.PathValue("queue"))
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, fmt.Errorf("message id: %w", err))
		return
	}
	row, err := s.Get(r.Context(), id)
	if err != nil {
		c.fail(w, r, statusOf(err), err)
		return
	}
	d := messageData{Queue: s.Queue(), Row: row}
	d.PayloadKind, d.Payload = FormatPayload(row.Payload)
	_, d.Headers = FormatPayload(row.Headers)
	if sc := row.SpanContext(); sc.HasTraceID() {
		d.TraceID = sc.TraceID().String()
	}
	c.render(w, r, "message", "Message "+id.String(), d)
}

// statusOf is the HTTP status of a library error.
func statusOf(err error) int {
	switch {
	case errors.Is(err, leasing.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, leasing.ErrNotFound):
		return http.StatusNotFound
	}
	return http.StatusInternalServerError
}

// action is one requested action: on one message (ID) or on every
// message Filter matches.
type action struct {
	Action leasing.BulkAction
	ID     string
	Filter filterForm
	Reason string
	Force  bool
	Count  int64
}

// actionOf reads an action from v and checks it against the store.
func (c *Console) actionOf(v url.Values) (action, *leasing.Postgres, error) {
	a := action{ID: v.Get("id"), Filter: filterOf(v), Reason: v.Get("reason"), Force: v.Get("force") == "on"}
	act, err := leasing.ParseBulkAction(v.Get("action"))
	if err != nil {
		return a, nil, err
	}
	a.Action = act
	s, err := c.store(a.Filter.Queue)
	if err != nil {
		return a, nil, err
	}
	if a.ID != "" {
		if _, err := uuid.Parse(a.ID); err != nil {
			return a, nil, fmt.Errorf("message id: %w", err)
		}
	}
	return a, s, nil
}

// bulk is a as the library's request.
func (a action) bulk() (leasing.BulkRequest, error) {
	f, err := a.Filter.filter()
	return leasing.BulkRequest{Action: a.Action, Filter: f, Reason: a.Reason, Force: a.Force, BatchSize: 500}, err
}

func (c *Console) confirmPage(w http.ResponseWriter, r *http.Request) {
	a, s, err := c.actionOf(r.URL.Query())
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if a.ID == "" {
		req, err := a.bulk()
		if req.Action == leasing.BulkDeadLetter && req.Reason == "" {
			req.Reason = "counted before the reason is given"
		}
		if err == nil {
			a.Count, err = s.BulkCount(r.Context(), req)
		}
		if err != nil {
			c.fail(w, r, statusOf(err), err)
			return
		}
	} else {
		a.Count = 1
	}
	c.render(w, r, "confirm", "Confirm "+string(a.Action), a)
}

// act runs a confirmed action: POST with the CSRF token.
func (c *Console) act(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	ck, err := r.Cookie(csrfCookie)
	token := r.PostForm.Get("csrf")
	if err != nil || token == "" || subtle.ConstantTimeCompare([]byte(ck.Value), []byte(token)) != 1 {
		http.Error(w, "missing or wrong CSRF token: reload the page and confirm again", http.StatusForbidden)
		return
	}
	a, s, err := c.actionOf(r.PostForm)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	var applied, matched int
	target := "filter " + a.Filter.Query()
	if a.ID != "" {
		target = "message " + a.ID
		applied, err = c.actOne(r, s, a)
		matched = 1
	} else {
		var req leasing.BulkRequest
		if req, err = a.bulk(); err == nil {
			var res leasing.BulkResult
			res, err = s.Bulk(r.Context(), req)
			applied, matched = res.Applied, res.Matched
		}
	}
	user := r.RemoteAddr
	if c.opts.User != nil {
		user = c.opts.User(r) + " (" + r.RemoteAddr + ")"
	}
	c.opts.Logger.Info("console action", "action", string(a.Action), "queue", string(s.Queue()), "target", target,
		"force", a.Force, "reason", a.Reason, "matched", matched, "applied", applied, "user", user, "error", errText(err))
	if err != nil {
		c.fail(w, r, statusOf(err), err)
		return
	}
	c.render(w, r, "done", "Done", struct {
		Action  action
		Applied int
		Matched int
	}{a, applied, matched})
}

// actOne does a on its one message and returns 1 when it was applied.
func (c *Console) actOne(r *http.Request, s *leasing.Postgres, a action) (int, error) {
	id := uuid.MustParse(a.ID)
	switch a.Action {
	case leasing.BulkRequeue:
		res, err := s.Requeue(r.Context(), id)
		return len(res.Requeued), err
	case leasing.BulkDeadLetter:
		_, err := s.DeadLetterByID(r.Context(), leasing.DeadLetterByIDRequest{ID: id, Reason: a.Reason, Force: a.Force})
		if err != nil {
			return 0, err
		}
		return 1, nil
	}
	deleted, err := s.PurgeByID(r.Context(), id)
	return len(deleted), err
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
