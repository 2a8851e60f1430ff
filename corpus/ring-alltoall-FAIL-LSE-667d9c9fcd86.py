"""attnfuzz repro: ring-alltoall FAIL:LSE
lse: diff_max=1.125e-07 baseline_max=0.000e+00 k=4 floor=1.000e-07 (ratio 1.12) worst at [0, 0, 3]:
got=2.58978 expected=2.58978

Run with: python3 ring-alltoall-FAIL-LSE-667d9c9fcd86.py   (exits 1 while the bug is there, 2 when attnfuzz or the kernel cannot be imported here)
"""
import sys

import torch

BACKEND = 'ring-alltoall'
DEVICE = 'cpu'
CASE = {'b': 1, 'sq': 4, 'skv': 4, 'h': 1, 'hk': 1, 'd_qk': 16, 'd_v': 16, 'dtype': 'float64', 'seqlens_q': None, 'seqlens_kv': None, 'causal': True, 'window': [None, None], 'alignment': 'top_left', 'mask_density': None, 'scale': None, 'softcap': None, 'alibi_slopes': None, 'softmax': 'vanilla', 'layout': 'bshd', 'memory': 'contiguous', 'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0], 'seed': 0, 'grads': False, 'spelling': ''}
VALID_ROWS = [4]  # graded query rows per sequence (rows past them are padding)
ROW_BOUNDS = torch.tensor([1.000000059199265e-07, 1.0000000355802497e-07, 1.0000000299360478e-07, 1.000000044897873e-07], dtype=torch.float64).reshape((1, 4, 1)).to(torch.float64)  # per output row (batch, query, head): k * naive same-dtype error + rounding floor
BOUND = 1.000000059199265e-07  # the largest, for the summary line
LSE_BOUNDS = torch.tensor([1.0000000221200794e-07, 1.0000000166497388e-07, 1.0000000160856803e-07, 1.0000000283908844e-07], dtype=torch.float64).reshape((1, 1, 4)).to(torch.float64)  # per LSE row (batch, head, query): the grader's bound (inf: not graded)


KERNEL_PATH = None  # the folder on sys.path that the fuzzing run imported the kernel's module from


def _adapter():
    """BACKEND's adapter, through attnfuzz; exits 2 (1 means the bug is there) when it cannot be made here."""
    import os
    if KERNEL_PATH and os.path.isdir(KERNEL_PATH) and KERNEL_PATH not in sys.path:
        sys.path.insert(0, KERNEL_PATH)  # import the kernel's module the way the run did, from any folder
    try:
        from attnfuzz.backends import get
        from attnfuzz.strategies import Case, materialize
        return get(BACKEND, DEVICE), Case, materialize
    except (ImportError, ValueError) as e:  # attnfuzz, or the kernel's module, is not importable here
        where = f" (the run imported it from {KERNEL_PATH})" if KERNEL_PATH else ""
        print(f"{BACKEND}: cannot run this repro here{where}: {e}", file=sys.stderr)
        sys.exit(2)


def attention(q, k, v):
    """No standalone spelling for this backend or case: call it through attnfuzz's adapter."""
    backend, Case, materialize = _adapter()
    case = Case.from_dict(CASE)
    t = materialize(case, DEVICE)
    t = type(t)(q=q, k=k, v=v, mask=t.mask, sink=t.sink, alibi=t.alibi, dout=t.dout)
    result = backend.run(case, t)
    return result.out if result.lse is None else (result.out, result.lse)


def main():
    q = torch.tensor([-2.310411800234176, -0.3732508612577643, -1.0608166785462863, 0.9995093547811761, -0.8840250045832653, -1.2755469302148053, -0.623224579866079, -0.8664416019125772, -1.2956271403277857, 1.52363162310635, 0.3236605664983738, 2.0177260314861085, 1.1357423400213507, -1.226881339001083, 0.07138847120511693, 0.3380174030507378, 0.15351883531544036, -0.6332746088675096, -1.2609246557194385, -0.726951062065411, -0.019964750907762653, 0.2102998901016947, 0.17718935139366584, -0.830510051008449, 1.0111892074660187, -0.2426793824588577, -0.7730112772958181, -1.5951814880783068, -0.6870036940435463, 1.4880743158106724, -0.4484158047114511, -0.8910030351707375, -0.09174174090816388, 0.5563227724483105, -0.009446277892507904, -1.21768777910687, -1.2654653080284903, -1.1195351830271254, 1.1664857205254855, 0.9262324572968778, 0.6539244967350809, 0.14821544548810084, -1.1461092231976013, 1.8727763768553416, -0.30991497424174674, 0.24018023403782535, -1.3487610270963772, 0.2443990933828689, -3.1452962731231335, -0.11373127757597257, 1.6962024805143952, -0.6652034805381666, -0.587222598359879, 2.832104167511146, 0.9039973689601122, 0.947836532432321, -1.3809366518587674, -2.0547510174380235, 0.04757655385024031, -0.3855687975933702, -0.27503491919216155, 0.886589630091246, 1.4857416299332185, -0.007855617400547969], dtype=torch.float64).reshape((1, 4, 1, 16)).to(torch.float64).to(DEVICE)
    k = torch.tensor([-1.1287986397999445, -0.09376858138313218, 0.998343579451126, -0.08262167465143246, 0.1825319491801699, 0.9509038124935927, -1.7631617835191395, 1.0107316682629284, 0.7494883300195011, -0.560555214098722, 0.07424681473465156, 1.9936457271364452, 0.44986533984459376, 1.5531453898519594, 0.05398594882285299, 1.4744415042312724, -0.7012303945657874, 0.326255796287562, -0.8738640219900763, 0.3941269998738486, 0.8915170821381018, 1.1731555158319225, -0.39490340565105597, 0.44642257211843217, -0.1726536808458421, 0.975120345181078, 0.4164541966117019, -0.4986513835421579, -0.4754698199105609, 0.28634406331767814, -1.3181871188381729, 0.8887144617352294, -0.5918823592164963, 0.6195092629710962, -1.4872950971304264, 1.3626823808042956, 0.4188191254194787, 0.34341487809757076, -0.34859980650048067, -1.2090699446332276, 0.20710026569896173, -0.11727393443191467, -0.017436740784596904, -0.24317130976865137, -0.43942236360685477, 2.7144660166018406, -1.4631736798004056, 0.4357325629861231, -0.5312331855486973, -0.13408449243234943, 1.3642724524235599, 0.2327705351743837, 1.1064458833206277, 0.8527354795918417, -0.6301719953003105, -0.6019872001874332, 1.114919051942112, -0.5559898033655196, 0.5331687087503058, -0.18787474948239727, 0.3993685890598303, -0.6760874461803966, 1.662168703751691, -0.6036839371988663], dtype=torch.float64).reshape((1, 4, 1, 16)).to(torch.float64).to(DEVICE)
    v = torch.tensor([0.0534191942795709, 0.013427502769270348, -1.5406177939388193, -0.4819087554044004, 0.7623209434576803, 0.21679229361763427, -0.4789120616253859, -0.2578760451372613, 0.2631423185835337, -0.4053288789025133, -0.0727123537950913, -0.13985617336865128, 0.785995459350369, -2.0568571650881626, -0.6711099455038106, -0.40096823326862124, 0.09346980467841959, -0.6487992451336398, -0.679095884649028, -0.08377947239717036, -1.3083177047571641, -1.41739733683466, 0.3237499278733888, -1.2819324564954782, -0.4117908858856197, -1.1128682991908616, -0.39202495491980177, -0.4522967443547727, 1.0930261889419515, -0.1639182226412006, -0.20150312169022844, -1.8609565968157826, 0.8942415239486997, -1.9664187911247126, 1.4864847606394493, -0.19825548808932353, -1.6795171874434074, 1.3863200736888246, -3.0465827500791125, -0.598281249533576, 0.11680004036673394, 0.029905566085560997, 0.8536195134028616, 0.9084886688785414, -1.1090488038575443, -0.624538324560581, 0.136098548491325, -0.4218880327975954, -0.10303497974091276, -1.2868901361560705, 1.4145046448860668, 0.4472847452382745, -0.20690503425652348, 1.1506583648125865, -0.5611667183722734, 0.04250801855538317, 0.8043963540244156, 0.9072091619347681, -0.21521353161099452, 0.5114427131934868, 0.8077315643111781, -1.3327491869404213, -0.2090149318312048, -0.675074260194335], dtype=torch.float64).reshape((1, 4, 1, 16)).to(torch.float64).to(DEVICE)
    EXPECTED = torch.tensor([0.0534191942795709, 0.013427502769270348, -1.5406177939388193, -0.4819087554044004, 0.7623209434576803, 0.21679229361763427, -0.4789120616253859, -0.2578760451372613, 0.2631423185835337, -0.4053288789025133, -0.0727123537950913, -0.13985617336865128, 0.785995459350369, -2.0568571650881626, -0.6711099455038106, -0.40096823326862124, 0.08429010744619866, -0.4970152652070377, -0.8765587998817139, -0.1750316715744551, -0.83372229463343, -1.0428371022166552, 0.13977784929496456, -1.047216238406244, -0.25709455523549823, -0.9506985446371368, -0.3188377307659839, -0.3806846062087515, 1.0226539995902595, -0.5977844283668218, -0.30913814692114283, -1.5263237159068337, 0.2618833647334148, -0.5898304347960586, -0.6481448448997732, -0.3354634968850263, -0.22986043807031703, 0.17230605298649465, -0.9324525290241261, -0.5417334027424155, 0.09466399914380999, -0.44155306293301316, 0.0850247753949949, 0.04834132917633999, 0.3947878104655723, -1.3406165165124375, -0.385649675031112, -0.6949025716263102, 0.043276310588361414, -0.5592633234427482, -0.3567430829767806, -0.13033679836256587, 0.1681827125599836, 0.4519549205539832, -0.5611311596098423, -0.25393544644027655, 0.3829228664112139, -0.006191448179569237, -0.10235303593103551, 0.09934177075139927, 0.7303395831706414, -1.6039435925579772, -0.44457135734430075, -0.6065308487057828], dtype=torch.float64).reshape((1, 4, 1, 16)).to(torch.float64)

    raw = attention(q, k, v)
    lse = raw[1] if isinstance(raw, tuple) and len(raw) > 1 and isinstance(raw[1], torch.Tensor) else None
    raw = raw[0] if isinstance(raw, tuple) else raw
    out = raw.detach().to("cpu", torch.float64)
    want = EXPECTED.to("cpu", torch.float64)
    rows = torch.arange(out.shape[1])[None, :] < torch.tensor(VALID_ROWS)[:, None]
    got, want = out[rows], want[rows]
    err = (got - want).abs().max().item() if got.numel() else 0.0
    over = ((out - EXPECTED.to("cpu", torch.float64)).abs().amax(-1) / ROW_BOUNDS.to(torch.float64))[rows]
    over = over.nan_to_num(nan=float("inf")).max().item() if over.numel() else 0.0
    problems = []
    if not torch.isfinite(got).all():
        problems.append("non-finite output")
    if got.numel() and (got == 0).all() and (want != 0).any():
        problems.append("all-zero output")
    if not over <= 1:
        problems.append(f"max |out - float64| = {err:.4g}: a row's error > bound ({over:.4g} x its own)")
    print(f"{BACKEND}: max |out - float64| = {err:.4g}; worst row at {over:.4g} x its bound (largest {BOUND:.4g})")
    if lse is not None:
        EXPECTED_LSE = torch.tensor([0.41983506250721464, 0.4862236102358556, 1.1492342853972657, 2.5897809334175013], dtype=torch.float64).reshape((1, 1, 4)).to(torch.float64)
        problems += check_lse(lse, EXPECTED_LSE)
    if False:
        problems += check_grads(raw, q, k, v, DOUT, EXPECTED_GRADS)
    if problems:
        print("  " + "\n  ".join(problems))
    return 1 if problems else 0




def check_lse(lse, want):
    """The LSE against the float64 one: -inf exactly on a row that sees no key, else within its row's bound."""
    lse, want = lse.detach().to("cpu", torch.float64), want.to("cpu", torch.float64)
    if lse.shape != want.shape:
        return [f"lse has shape {tuple(lse.shape)}, expected {tuple(want.shape)} (b, h, sq)"]
    rows = (torch.arange(want.shape[2])[None, :] < torch.tensor(VALID_ROWS)[:, None])[:, None, :].expand_as(want)
    empty, graded = rows & torch.isinf(want), rows & torch.isfinite(want)
    over = ((lse - want).abs() / LSE_BOUNDS)[graded].nan_to_num(nan=float("inf"), posinf=float("inf"))
    over = over.max().item() if over.numel() else 0.0
    err = (lse - want)[graded].abs().max().item() if graded.any() else 0.0
    print(f"{BACKEND}: max |lse - float64| = {err:.4g}; worst row at {over:.4g} x its bound")
    problems = []
    if not torch.equal(lse[empty], want[empty]):
        problems.append("lse of a row that sees no key is not -inf")
    if not over <= 1:
        problems.append(f"max |lse - float64| = {err:.4g}: a row's error > bound ({over:.4g} x its own)")
    return problems


if __name__ == "__main__":  # the guard lets backends that spawn processes (context parallelism) import this file
    sys.exit(main())
