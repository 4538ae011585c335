package console_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/leasestore/leasestore/console"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(dbtest.Main(m)) }

// lockedBuffer is a log sink for the audit lines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type fixture struct {
	srv    *httptest.Server
	client *http.Client
	inbox  *leasing.Postgres
	log    *lockedBuffer
	ids    []uuid.UUID // json, <script>, binary (dead-lettered)
}

func newFixture(t *testing.T, readOnly bool) *fixture {
	t.Helper()
	url := dbtest.DatabaseURL(t)
	inbox := dbtest.OpenStore(t, url, leasing.Inbox, leasing.PostgresOptions{})
	outbox := dbtest.OpenStore(t, url, leasing.Outbox, leasing.PostgresOptions{})
	res, err := inbox.Enqueue(t.Context(),
		leasing.NewMessage{Type: "order", Payload: []byte(`{"order":7}`), Headers: []byte(`{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`)},
		leasing.NewMessage{Type: "order", Payload: []byte(`<script>alert("x")</script>`)},
		leasing.NewMessage{Type: "bin", Payload: []byte{0xff, 0}})
	require.NoError(t, err)
	_, err = inbox.DeadLetterByID(t.Context(), leasing.DeadLetterByIDRequest{ID: res.IDs[2], Reason: "boom <b>bold</b>"})
	require.NoError(t, err)
	_, err = outbox.Enqueue(t.Context(), leasing.NewMessage{Topic: "orders", OrderingKey: "cust-<1>"},
		leasing.NewMessage{Topic: "orders", OrderingKey: "cust-<1>"})
	require.NoError(t, err)
	log := &lockedBuffer{}
	c, err := console.New(console.Options{ReadOnly: readOnly, Logger: slog.New(slog.NewTextHandler(log, nil)),
		User: func(*http.Request) string { return "alice" }}, inbox, outbox)
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &fixture{srv: srv, client: &http.Client{Jar: jar}, inbox: inbox, log: log, ids: res.IDs}
}

func (f *fixture) get(t *testing.T, path string, want int) string {
	t.Helper()
	resp, err := f.client.Get(f.srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, want, resp.StatusCode, "%s: %s", path, body)
	return string(body)
}

func (f *fixture) post(t *testing.T, form url.Values, want int) string {
	t.Helper()
	resp, err := f.client.PostForm(f.srv.URL+"/act", form)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, want, resp.StatusCode, "%v: %s", form, body)
	return string(body)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// confirm opens the confirmation page of query and returns its form.
func (f *fixture) confirm(t *testing.T, query string) url.Values {
	t.Helper()
	body := f.get(t, "/confirm?"+query, http.StatusOK)
	m := csrfRE.FindStringSubmatch(body)
	require.NotNil(t, m, body)
	form, err := url.ParseQuery(query)
	require.NoError(t, err)
	form.Set("csrf", m[1])
	return form
}

func TestPages(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	body := f.get(t, "/", http.StatusOK)
	require.Contains(t, body, `<h2>inbox</h2>`)
	require.Contains(t, body, `href="./messages?queue=inbox&amp;status=dead_lettered">1</a>`)

	body = f.get(t, "/dead-letters", http.StatusOK)
	require.Contains(t, body, "boom &lt;b&gt;bold&lt;/b&gt;")
	require.NotContains(t, body, "<b>bold</b>")

	body = f.get(t, "/messages?queue=inbox&type=order", http.StatusOK)
	require.Contains(t, body, f.ids[0].String())
	require.Contains(t, body, f.ids[1].String())
	require.NotContains(t, body, f.ids[2].String())
	body = f.get(t, "/messages?queue=inbox&status=dead_lettered&error=boom", http.StatusOK)
	require.Contains(t, body, f.ids[2].String())
	require.NotContains(t, body, f.ids[0].String())
	body = f.get(t, "/messages?queue=outbox&status=failed", http.StatusOK)
	require.Contains(t, body, "No messages match.")

	body = f.get(t, "/keys", http.StatusOK)
	require.Contains(t, body, "No ordering keys in use.") // the inbox
	require.Contains(t, body, "cust-&lt;1&gt;</a>")
	require.Regexp(t, `<td class="n">1</td>`, body) // one waits behind the head
	body = f.get(t, "/doctor", http.StatusOK)
	require.Contains(t, body, "claim of 10:")
	require.Contains(t, body, "inbox (inbox_messages)")

	body = f.get(t, "/messages/inbox/"+f.ids[0].String(), http.StatusOK)
	require.Contains(t, body, "{\n  &#34;order&#34;: 7\n}")
	require.Contains(t, body, "4bf92f3577b34da6a3ce929d0e0e4736")
	require.Contains(t, body, `href="../../dead-letters"`)
	body = f.get(t, "/messages/inbox/"+f.ids[1].String(), http.StatusOK)
	require.Contains(t, body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;")
	require.NotContains(t, body, "<script>")
	body = f.get(t, "/messages/inbox/"+f.ids[2].String(), http.StatusOK)
	require.Contains(t, body, "Binary payload, not shown.")
	require.Contains(t, body, "dead_lettered (operator)")

	// Bad input is a 4xx page that says why.
	require.Contains(t, f.get(t, "/messages/inbox/"+uuid.NewString(), http.StatusNotFound), "not found")
	require.Contains(t, f.get(t, "/messages/inbox/nope", http.StatusBadRequest), "message id")
	require.Contains(t, f.get(t, "/messages?queue=inbox&status=lost", http.StatusBadRequest), "lost")
	require.Contains(t, f.get(t, "/messages?queue=inbox&older_than=7x", http.StatusBadRequest), "7d")
	require.Contains(t, f.get(t, "/messages?queue=inbox&after=x", http.StatusBadRequest), "cursor")
	require.Contains(t, f.get(t, "/messages?queue=nope", http.StatusBadRequest), "nope")
	require.Contains(t, f.get(t, "/confirm?action=frob&queue=inbox", http.StatusBadRequest), "frob")
	f.get(t, "/nothing", http.StatusNotFound)
}

func TestActions(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	ctx := t.Context()

	// Requeue by filter: the confirmation counts first.
	body := f.get(t, "/confirm?action=requeue&queue=inbox&status=dead_lettered&error=boom", http.StatusOK)
	require.Contains(t, body, "requeue the 1 inbox messages that match")
	form := f.confirm(t, "action=requeue&queue=inbox&status=dead_lettered&error=boom")
	require.Contains(t, f.post(t, form, http.StatusOK), "requeue: 1 of 1 matched messages.")
	row, err := f.inbox.Get(ctx, f.ids[2])
	require.NoError(t, err)
	require.Equal(t, leasing.StatusPending, row.Status)
	require.Contains(t, f.log.String(), `msg="console action" action=requeue queue=inbox target="filter error=boom&queue=inbox&status=dead_lettered"`)
	require.Contains(t, f.log.String(), "applied=1 user=\"alice (")

	// Dead-letter one by id, with a reason.
	form = f.confirm(t, "action=dead-letter&queue=inbox&id="+f.ids[0].String())
	form.Set("reason", "poison")
	f.post(t, form, http.StatusOK)
	row, err = f.inbox.Get(ctx, f.ids[0])
	require.NoError(t, err)
	require.Equal(t, leasing.StatusDeadLettered, row.Status)
	require.Equal(t, "poison", row.LastError)
	// Again: already terminal, a 4xx that says so, nothing changed.
	require.Contains(t, f.post(t, form, http.StatusInternalServerError), "dead_lettered")

	// Requeue one by id, then purge it by id.
	f.post(t, f.confirm(t, "action=requeue&queue=inbox&id="+f.ids[0].String()), http.StatusOK)
	row, err = f.inbox.Get(ctx, f.ids[0])
	require.NoError(t, err)
	require.Equal(t, leasing.StatusPending, row.Status)
	f.post(t, f.confirm(t, "action=purge&queue=inbox&id="+f.ids[0].String()), http.StatusOK)
	_, err = f.inbox.Get(ctx, f.ids[0])
	require.ErrorIs(t, err, leasing.ErrNotFound)

	// Dead-letter and purge all matching a filter.
	form = f.confirm(t, "action=dead-letter&queue=inbox&type=order")
	form.Set("reason", "misrouted")
	require.Contains(t, f.post(t, form, http.StatusOK), "dead-letter: 1 of 1")
	require.Contains(t, f.post(t, f.confirm(t, "action=purge&queue=inbox"), http.StatusOK), "purge: 2 of 2")
	n, err := f.inbox.CountMatching(ctx, leasing.ListFilter{})
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestCSRFRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	before := dbtest.TableDigest(t, f.inbox.Pool())
	form := f.confirm(t, "action=purge&queue=inbox")
	for name, mutate := range map[string]func(url.Values){
		"no token":    func(v url.Values) { v.Del("csrf") },
		"wrong token": func(v url.Values) { v.Set("csrf", strings.Repeat("0", 32)) },
	} {
		v := url.Values{}
		for k, s := range form {
			v[k] = s
		}
		mutate(v)
		require.Contains(t, f.post(t, v, http.StatusForbidden), "CSRF", name)
	}
	// The right token without the cookie (another site's form).
	resp, err := http.PostForm(f.srv.URL+"/act", form)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, before, dbtest.TableDigest(t, f.inbox.Pool()))
	require.NotContains(t, f.log.String(), "console action")
}

func TestReadOnlyRefusesWrites(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	before := dbtest.TableDigest(t, f.inbox.Pool())
	require.Contains(t, f.get(t, "/", http.StatusOK), "Read-only")
	body := f.get(t, "/messages?queue=inbox", http.StatusOK)
	require.NotContains(t, body, "confirm?action")
	require.Contains(t, f.get(t, "/confirm?action=purge&queue=inbox", http.StatusOK), "The console is read-only.")
	for _, path := range []string{"/act", "/", "/messages", "/confirm"} {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader("action=purge&queue=inbox"))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := f.client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s %s", method, path)
		}
	}
	require.Equal(t, before, dbtest.TableDigest(t, f.inbox.Pool()))
}
