"""Real sentences of mixed lengths, from a few words to a paragraph, for comparing embeddings."""

SENTENCES = [
    "Hello!",
    "The cat sat on the mat.",
    "A man is playing a guitar.",
    "Paris is the capital of France.",
    "I love reading books on rainy afternoons.",
    "The stock market fell sharply after the announcement.",
    "Photosynthesis converts light energy into chemical energy.",
    "She ordered a cup of green tea and a slice of lemon cake.",
    "Quantum computers use qubits, which can be in superpositions of states.",
    "The quick brown fox jumps over the lazy dog.",
    "Where is the nearest train station?",
    "Python is a popular programming language for data science.",
    "The committee postponed its decision until next week because several members were absent.",
    "Mount Everest is the highest mountain above sea level.",
    "He forgot his umbrella and got soaked on the way home.",
    "Vaccines train the immune system to recognize pathogens.",
    "The orchestra performed Beethoven's Ninth Symphony to a sold-out audience.",
    "Can you recommend a good Italian restaurant nearby?",
    "Electric cars are becoming more affordable every year.",
    "The library will be closed on Monday for the public holiday.",
    "Thanks.",
    "In 1969, Neil Armstrong became the first person to walk on the Moon, an event watched by millions of "
    "people around the world on live television.",
    "Machine learning models can inherit biases present in their training data, which is why careful "
    "evaluation on diverse datasets matters before they are deployed in sensitive settings such as hiring "
    "or lending.",
    "The river flooded the valley after three days of heavy rain.",
    "My grandmother grows tomatoes, peppers and basil in her small garden behind the house.",
    "A stitch in time saves nine.",
    "The new smartphone has a larger screen, a faster processor and a camera that performs well in low light.",
    "Coral reefs are threatened by rising ocean temperatures and acidification.",
    "The detective examined the footprints near the window and concluded that the thief had escaped through "
    "the garden, climbing over the wall while the guards were changing shifts at midnight.",
    "Please remember to submit your expense reports by Friday.",
    "Bananas are an excellent source of potassium.",
    "The museum's new exhibition explores the history of printing, from woodblocks in ancient China to "
    "Gutenberg's movable type and the digital presses of today, with hands-on demonstrations for children.",
    "Two plus two equals four.",
    "Wind turbines generate electricity without burning fuel.",
    "The meeting ran late, so we ordered pizza.",
    "Sleep is essential for memory consolidation and overall health.",
]
